"""The end-of-run summary (grpokit.cli.summary), from a run folder's files built by hand."""

import json
from importlib.resources import files

import pytest

from grpokit.cli.summary import recipe_args, run_summary

pytestmark = pytest.mark.unit
RECIPE = ["--config", "reverse_text", "--model.model", "/tmp/tiny model"]


def write_run(run, rewards, evals=(), checkpoints=()):
    """metrics.csv as the CSV logger writes it: a row per trained step, and rows of other metrics (the
    rollout thread's, eval's) without a loss, which the summary skips."""
    run.mkdir(parents=True, exist_ok=True)
    rows = ["step,loss,reward,eval/reward"]
    for step, reward in enumerate(rewards):
        rows += [f"{step},0.5,{reward},", f"{step},,,0.9"]
    (run / "metrics.csv").write_text("\n".join(rows) + "\n")
    if evals:
        lines = [json.dumps({"eval/reward": r, "eval/seq_len": 7.0, "eval/weight_step": float(s)}) for s, r in evals]
        (run / "eval.jsonl").write_text("\n".join(lines) + "\n")
    (run / "checkpoints").mkdir(exist_ok=True)
    for step in checkpoints:
        (run / "checkpoints" / f"step_{step}.ckpt").write_bytes(b"")


def test_a_finished_run_with_eval_and_checkpoints(tmp_path):
    run = tmp_path / "outputs" / "r"
    rewards = [0.1, 0.2, 0.3, 0.4, 0.5, 0.0, 0.0, 0.6, 0.6, 0.6, 0.9, 1.0]  # steps 0-11
    write_run(run, rewards, evals=[(0, 0.25), (10, 0.5), (12, 0.75)], checkpoints=[10, 12])
    assert run_summary(run, RECIPE, 12, 12) == (
        f"grpokit: trained 12 steps: {run}\n"
        "  reward      0.300 (mean of steps 0-4) -> 0.740 (mean of steps 7-11)\n"  # (.6+.6+.6+.9+1)/5
        "  eval reward 0.250 (weights of step 0) -> 0.750 (step 12)\n"
        f"  checkpoint  {run}/checkpoints/step_12.ckpt\n"
        f"  export      grpokit export {run} --merge --out {run}/merged\n"
        f"  evaluate    grpokit eval --config reverse_text --model.model '/tmp/tiny model' --ckpt {run}\n"
    )


def test_a_short_run_compares_its_first_and_last_step_and_one_eval(tmp_path):
    run = tmp_path / "r"
    write_run(run, [0.174, 0.16], evals=[(0, 0.0)], checkpoints=[2])
    lines = run_summary(run, ["--config", "r.yaml"], 2, 2).splitlines()
    assert lines[1:3] == ["  reward      0.174 (step 0) -> 0.160 (step 1)", "  eval reward 0.000 (weights of step 0)"]


def test_a_ctrl_c_stop_says_at_which_step_and_how_to_resume(tmp_path):
    run = tmp_path / "r"
    write_run(run, [0.0, 0.5, 1.0], checkpoints=[3])
    (run / "eval.jsonl").write_text('{"eval/reward": 0.5, "eval/weight_step": 0.0}\n{"eval/rew')  # cut short
    text = run_summary(run, ["--config", "r.yaml"], 3, 10, stopped_by_ctrl_c=True)
    assert text.splitlines()[0] == f"grpokit: stopped by Ctrl-C after 3 steps (of 10): {run}"
    assert "  reward      0.000 (step 0) -> 1.000 (step 2)\n  eval reward 0.500 (weights of step 0)\n" in text
    assert "  resume      the same command with --ckpt.resume_step -1\n" in text
    sigterm = run_summary(run, ["--config", "r.yaml"], 3, 10, stopped_by_ctrl_c=True, signal="SIGTERM")
    assert sigterm.splitlines()[0] == f"grpokit: stopped by SIGTERM after 3 steps (of 10): {run}"


def test_a_run_without_checkpoints_or_eval_still_shows_the_commands(tmp_path):
    """export and eval read the weights the run published to broadcasts/ too."""
    run = tmp_path / "r"
    write_run(run, [0.2])
    text = run_summary(run, ["--config", "r.yaml"], 1, 1, stopped_by_ctrl_c=True)
    assert text == (
        f"grpokit: stopped by Ctrl-C after 1 step (of 1): {run}\n"
        "  reward      0.200 (step 0) -> 0.200 (step 0)\n"
        "  checkpoint  none (ckpt.interval 0)\n"
        f"  export      grpokit export {run} --merge --out {run}/merged\n"
        f"  evaluate    grpokit eval --config r.yaml --ckpt {run}\n"
    )


def test_the_eval_command_keeps_the_recipe_and_drops_the_run_flags():
    shipped = str(files("grpokit.recipes") / "ablations" / "gspo.yaml")
    argv = ["fit", "--config", "mine.yaml", "--config", shipped, "--model.lr=1e-4", "--trainer.max_steps", "2",
            "--run_name", "r", "--output_dir", "o", "--ckpt.interval", "1", "--data.filters", "[]"]  # fmt: skip
    assert recipe_args(argv) == [
        "--config", "mine.yaml", "--config", "ablations/gspo", "--model.lr", "1e-4", "--data.filters", "[]",
    ]  # fmt: skip
