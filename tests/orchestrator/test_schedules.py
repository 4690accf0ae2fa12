"""Temperature schedules on hand-computed values, and a scheduled run end to end."""

import csv
from pathlib import Path

import pytest

from grpokit.cli import main
from grpokit.orchestrator.schedules import TemperatureSchedule

RECIPE = str(Path(__file__).resolve().parents[2] / "recipes" / "reverse_text.yaml")


def test_linear_and_cosine_hand_values():
    lin = TemperatureSchedule("linear", 1.0, 0.5)
    assert [lin.at(s, 5) for s in range(5)] == pytest.approx([1.0, 0.875, 0.75, 0.625, 0.5])
    cos = TemperatureSchedule("cosine", 1.0, 0.5)
    assert cos.at(0, 5) == 1.0 and cos.at(2, 5) == pytest.approx(0.75) and cos.at(4, 5) == pytest.approx(0.5)
    assert cos.at(1, 5) == pytest.approx(1.0 - 0.5 * 0.5 * (1 - 2 ** -0.5))


def test_scheduled_temperature_reaches_batches(tmp_path, tiny_model):
    argv = [
        "fit", "--config", RECIPE, "--output_dir", str(tmp_path), "--run_name", "r", "--model.model", tiny_model,
        "--model.lora.rank", "4", "--data.batch_size", "8", "--data.rollouts_per_example", "4",
        "--data.sampling.max_tokens", "6", "--data.sampling.temperature", "null", "--data.seq_len", "128",
        "--data.filters", "[]", "--data.temp_scheduler", '{"type": "linear", "start_temperature": 1.2, "end_temperature": 0.6}',
        "--data.eval", "null", "--trainer.max_steps", "3", "--ckpt.interval", "0",
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
    ]
    assert main(argv) == 0
    rows = [r for r in csv.DictReader(open(tmp_path / "r" / "metrics.csv")) if r.get("loss")]
    assert [float(r["temperature"]) for r in rows] == pytest.approx([1.2, 0.9, 0.6])
