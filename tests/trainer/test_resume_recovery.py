"""Resumes that do not continue the newest checkpoint, on the tiny model: a bad newest checkpoint is
passed over for the previous one, and a resume from an older checkpoint sets the later history aside
and trains on (co-locate `fit` samples the steps from the checkpoint on again)."""

import json
import logging
import shutil

import pytest
import torch

from grpokit.main import main
from grpokit.testing import tiny_fit_argv
from grpokit.trainer.checkpoint import checkpoint_problem, checkpoint_steps
from tests.support import read_metrics

STEPS = 8


def argv(output_dir, tiny_model, name, *extra):
    return tiny_fit_argv(output_dir, tiny_model, name, "--trainer.max_steps", str(STEPS), "--ckpt.interval", "2",
                         "--ckpt.keep_last", "4", "--data.eval", "null", *extra)  # fmt: skip


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_model):
    """A run of STEPS steps with checkpoints 2, 4, 6 and 8, and the batches of steps 4-7 (the transport kept
    those from the checkpoint of step 6 on, and 4 read batches)."""
    output_dir = tmp_path_factory.mktemp("finished")
    assert main(argv(output_dir, tiny_model, "base")) == 0
    assert checkpoint_steps(output_dir / "base" / "checkpoints") == [2, 4, 6, 8]
    assert sorted(p.name for p in (output_dir / "base" / "rollouts").iterdir()) == [
        f"step_{s}.safetensors" for s in range(4, STEPS)
    ]
    return output_dir / "base"


def copy_of(finished_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    return run


def trained_steps(run):
    return [int(r["step"]) for r in read_metrics(run)]


def test_a_truncated_newest_checkpoint_falls_back_to_the_previous_one(finished_run, tmp_path, tiny_model, caplog):
    run = copy_of(finished_run, tmp_path)
    newest = run / "checkpoints" / "step_8.ckpt"
    cut = newest.read_bytes()[: newest.stat().st_size // 3]
    newest.write_bytes(cut)  # torch.load would fail with "failed finding central directory"
    # temp files and folders of writes a kill cut short: a weight publish, a batch, a checkpoint
    (run / "broadcasts" / ".step_8.4242.tmp").mkdir()
    (run / "broadcasts" / ".step_8.4242.tmp" / "adapter_model.safetensors").write_bytes(b"half")
    (run / "rollouts" / ".step_8.safetensors.x1y2.tmp").write_bytes(b"half")
    (run / "checkpoints" / ".step_8.ckpt.4242.tmp").write_bytes(b"half")
    with caplog.at_level(logging.WARNING, logger="grpokit"):
        assert main(argv(tmp_path, tiny_model, "run", "--ckpt.resume_step", "-1")) == 0
    warnings = [r.getMessage() for r in caplog.records]
    assert any(f"{newest} is truncated or not a checkpoint" in w and "resuming from step_6.ckpt" in w for w in warnings)
    [archive] = (run / "archive").glob("after_step_6_*")
    assert (archive / "checkpoints" / "step_8.ckpt").read_bytes() == cut  # set aside as it was, not deleted
    assert trained_steps(run) == list(range(STEPS))  # steps 6 and 7 trained again, once each in the log
    assert checkpoint_problem(newest) is None
    assert not [p.relative_to(run) for p in run.rglob(".*.tmp")]
    assert torch.load(newest, map_location="cpu", weights_only=True)["global_step"] == STEPS


def test_resuming_an_older_checkpoint_sets_the_later_history_aside_and_continues(finished_run, tmp_path, tiny_model):
    """The later checkpoints and batches move to the archive, so the rollout thread samples steps 2.. again
    with this run's weights. Before, it sampled steps 2 and 3 (their batches were gone) while the trainer
    went on to the batches of steps 4-7 left by the abandoned history, and the run failed: "the batch for
    step N was sampled with weights of step N+1 ... restart the engine (grpokit infer)"."""
    run = copy_of(finished_run, tmp_path)
    later = {s: (run / "checkpoints" / f"step_{s}.ckpt").read_bytes() for s in (4, 6, 8)}
    batches_before = sorted(p.name for p in (run / "rollouts").iterdir())
    samples_before = len(open(run / "samples.jsonl").readlines())

    assert main(argv(tmp_path, tiny_model, "run", "--ckpt.resume_step", "2")) == 0

    [archive] = (run / "archive").glob("after_step_2_*")
    assert {s: (archive / "checkpoints" / f"step_{s}.ckpt").read_bytes() for s in (4, 6, 8)} == later
    assert sorted(p.name for p in (archive / "rollouts").iterdir()) == batches_before  # all of steps >= 2
    assert trained_steps(run) == list(range(STEPS))
    assert checkpoint_steps(run / "checkpoints") == [2, 4, 6, 8]  # this history's: a later resume -1 takes its 8
    resampled = [json.loads(line) for line in open(run / "samples.jsonl").readlines()[samples_before:]]
    assert sorted({s["step"] for s in resampled}) == list(range(2, STEPS))
    assert all(2 <= s["policy_step"] <= s["step"] for s in resampled)  # never weights of the abandoned steps
