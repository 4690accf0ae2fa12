"""Temperature schedules on hand-computed values, and a scheduled run end to end."""

import pytest

from grpokit.main import main
from grpokit.orchestrator.schedules import TemperatureSchedule
from grpokit.testing import tiny_fit_argv
from tests.support import read_metrics


def test_linear_and_cosine_hand_values():
    lin = TemperatureSchedule("linear", 1.0, 0.5)
    assert [lin.at(s, 5) for s in range(5)] == pytest.approx([1.0, 0.875, 0.75, 0.625, 0.5])
    cos = TemperatureSchedule("cosine", 1.0, 0.5)
    assert cos.at(0, 5) == 1.0 and cos.at(2, 5) == pytest.approx(0.75) and cos.at(4, 5) == pytest.approx(0.5)
    assert cos.at(1, 5) == pytest.approx(1.0 - 0.5 * 0.5 * (1 - 2**-0.5))


def test_scheduled_temperature_reaches_batches(tmp_path, tiny_model):
    argv = tiny_fit_argv(
        tmp_path,
        tiny_model,
        "r",
        "--data.sampling.max_tokens",
        "6",
        "--data.sampling.temperature",
        "null",
        "--data.temp_scheduler",
        '{"type": "linear", "start_temperature": 1.2, "end_temperature": 0.6}',
        "--data.eval",
        "null",
        "--trainer.max_steps",
        "3",
        "--ckpt.interval",
        "0",
    )
    assert main(argv) == 0
    rows = read_metrics(tmp_path / "r")
    assert [float(r["temperature"]) for r in rows] == pytest.approx([1.2, 0.9, 0.6])
