"""QeRL's geometric schedule: the default sigma sequence by hand, stage boundaries, edge cases, errors."""

import pytest

from grpokit.noise import stage_of
from grpokit.registry.noise.qerl import QeRL

# Defaults 5e-2 -> 5e-4 over 10 stages: stage 0 is 0, stage k = 1..9 is 5e-2 * (1e-2) ** ((k - 1) / 8),
# i.e. 5e-2 * 10 ** (-(k - 1) / 4): 5e-2, 2.8117e-2, 1.5811e-2, 8.8914e-3, 5e-3, 2.8117e-3, 1.5811e-3, 8.8914e-4, 5e-4.
DEFAULT_SIGMAS = [
    0.0,
    5e-2,
    2.8117066259517456e-2,
    1.5811388300841896e-2,
    8.891397050194614e-3,
    5e-3,
    2.8117066259517456e-3,
    1.5811388300841896e-3,
    8.891397050194614e-4,
    5e-4,
]


def test_default_sequence_one_value_per_stage():
    s = QeRL()
    # 100 steps in 10 stages of 10: the first step of each stage carries that stage's sigma
    assert [s.sigma(10 * k, 100) for k in range(10)] == pytest.approx(DEFAULT_SIGMAS, rel=1e-12)
    assert s.sigma(9, 100) == 0.0 and s.sigma(10, 100) == 5e-2  # the stage boundary
    assert s.sigma(100, 100) == pytest.approx(5e-4, rel=1e-12)  # weights after the last step: last stage


def test_sigma_is_constant_within_a_stage_and_ratio_between_stages():
    s = QeRL()
    for k in range(1, 10):
        assert len({s.sigma(step, 200) for step in range(20 * k, 20 * k + 20)}) == 1
    ratios = [s.sigma(20 * (k + 1), 200) / s.sigma(20 * k, 200) for k in range(1, 9)]
    assert ratios == pytest.approx([10**-0.25] * 8, rel=1e-12)


def test_stages_when_max_steps_does_not_divide():
    # 25 steps, 10 stages: stage = floor(step * 10 / 25); steps 0..2 -> 0, 3..4 -> 1, 5 -> 2, 24 -> 9
    assert [stage_of(step, 25, 10) for step in (0, 2, 3, 4, 5, 24, 25, 99)] == [0, 0, 1, 1, 2, 9, 9, 9]
    assert QeRL().sigma(2, 25) == 0.0 and QeRL().sigma(3, 25) == 5e-2


def test_two_stages_and_custom_range():
    s = QeRL(sigma_start=1e-2, sigma_end=1e-4, num_stages=2)
    assert [s.sigma(step, 10) for step in range(11)] == [0.0] * 5 + [1e-2] * 6
    s = QeRL(sigma_start=1e-2, sigma_end=1e-4, num_stages=3)  # stages 0, 1, 2: 0, start, end
    assert [s.sigma(step, 3) for step in range(3)] == pytest.approx([0.0, 1e-2, 1e-4], rel=1e-12)


def test_disabled_is_zero_everywhere():
    s = QeRL(enabled=False)
    assert all(s.sigma(step, 50) == 0.0 for step in range(51))


@pytest.mark.parametrize(
    "kwargs, match", [({"num_stages": 1}, "num_stages must be >= 2"), ({"sigma_end": 0.0}, "LinearNoise")]
)
def test_bad_arguments_name_the_recipe_key(kwargs, match):
    with pytest.raises(ValueError, match=match) as e:
        QeRL(**kwargs)
    assert "model.noise_scheduler.init_args" in str(e.value)
