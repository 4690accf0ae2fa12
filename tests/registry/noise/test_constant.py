"""ConstantNoise: one sigma from the first step to the last."""

import pytest

from grpokit.registry.noise.constant import ConstantNoise


def test_constant_everywhere_and_disabled():
    assert {ConstantNoise(sigma=3e-3).sigma(step, 10) for step in range(11)} == {3e-3}
    assert ConstantNoise(enabled=False, sigma=3e-3).sigma(5, 10) == 0.0


def test_negative_sigma_is_refused():
    with pytest.raises(ValueError, match="model.noise_scheduler.init_args.sigma must be >= 0"):
        ConstantNoise(sigma=-1.0)
