"""Replicates are replicates: a sweep over seed_everything of a shipped recipe samples different prompts
and rollouts per seed, and the report refuses a CI over "seeds" whose rollouts were identical."""

from pathlib import Path

import yaml

from grpokit.main import main
from grpokit.sweep.report_stats import RunMetrics, identical_replicates
from grpokit.transport.codec import decode_batch

REPO = Path(__file__).resolve().parents[2]


def sweep(tmp_path, overlay: Path, runs: list[dict]) -> Path:
    """A sweep of the shipped reverse-text recipe with `overlay`, one run per entry."""
    spec = tmp_path / "seeds.yaml"
    spec.write_text(yaml.safe_dump({"runs": runs}))
    sweep_dir = tmp_path / "sweep"
    recipe = str(REPO / "recipes" / "reverse_text.yaml")
    argv = ["sweep", "--config", recipe, "--config", str(overlay), "--sweep", str(spec), "--sweep_dir", str(sweep_dir)]
    assert main(argv) == 0
    return sweep_dir


def step0(run_dir: Path) -> tuple[list[list[int]], list[float]]:
    """The step-0 batch's token rows and the rewards metric."""
    batch = decode_batch((run_dir / "rollouts" / "step_0.safetensors").read_bytes())
    rows = [mb.input_ids_T.tolist() for mb in batch.micro_batches]
    return rows, batch.metrics["reward"]


def test_seed_everything_varies_the_rollouts_and_the_report_flags_pinned_ones(tmp_path, tiny_overlay):
    """Runs 0 and 1 differ only in seed_everything: their step-0 prompts and rollouts differ. Run 2 pins
    data.seed to run 0's: the same step (LoRA's B starts at 0, so the first rollouts do not see
    seed_everything), which the report flags instead of printing a CI over it."""
    runs = [{"seed_everything": 0}, {"seed_everything": 1}, {"seed_everything": 2, "data.seed": 0}]
    sweep_dir = sweep(tmp_path, tiny_overlay(steps=1, ckpt_interval=0), runs)
    run0, run1, run2 = sorted(p for p in sweep_dir.iterdir() if p.is_dir() and p.name[:2].isdigit())
    assert step0(run0)[0] != step0(run1)[0], "seed_everything must change the step-0 prompts and rollouts"
    assert step0(run0) == step0(run2)
    for run, seed in ((run0, 0), (run1, 1), (run2, 0)):  # config.yaml records the data seed that ran
        assert yaml.safe_load((run / "config.yaml").read_text())["data"]["seed"] == seed
    assert main(["report", str(sweep_dir)]) == 0
    report = (sweep_dir / "report.md").read_text()
    assert f"Warning: the seeds of base are not replicates**: {run0.name} and {run2.name}" in report, report
    assert "[identical replicates]" in report


def test_identical_replicates_compares_reward_and_length_at_every_step():
    a = RunMetrics("a", {"reward": {0: 0.5, 1: 0.6}, "seq_len": {0: 7.0, 1: 8.0}})
    b = RunMetrics("b", {"reward": {0: 0.5, 1: 0.6}, "seq_len": {0: 7.0, 1: 8.0}, "loss": {0: 1.0}})
    c = RunMetrics("c", {"reward": {0: 0.5, 1: 0.7}, "seq_len": {0: 7.0, 1: 8.0}})
    empty = RunMetrics("d", {})
    assert identical_replicates([a, b, c, empty, RunMetrics("e", {})]) == [("a", "b")]
