"""LinearNoise: QeRL's stages with a linear decay, by hand."""

import pytest

from grpokit.registry.noise.linear import LinearNoise


def test_linear_sequence_by_hand():
    s = LinearNoise(sigma_start=0.09, sigma_end=0.01, num_stages=5)
    # stage 0 -> 0; stages 1..4 -> 0.09 + (0.01 - 0.09) * (k - 1) / 3: 0.09, 0.09 - 0.08/3, 0.09 - 0.16/3, 0.01
    assert [s.sigma(2 * k, 10) for k in range(5)] == pytest.approx(
        [0.0, 0.09, 0.09 - 0.08 / 3, 0.09 - 0.16 / 3, 0.01], rel=1e-12
    )


def test_decay_to_zero_and_disabled():
    s = LinearNoise(sigma_start=0.02, sigma_end=0.0, num_stages=3)
    assert [s.sigma(step, 3) for step in range(4)] == [0.0, 0.02, 0.0, 0.0]
    assert LinearNoise(enabled=False).sigma(50, 100) == 0.0


def test_negative_sigma_is_refused():
    with pytest.raises(ValueError, match="model.noise_scheduler.init_args.sigma_start and sigma_end must be >= 0"):
        LinearNoise(sigma_end=-1e-3)
