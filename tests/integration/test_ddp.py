"""`grpokit fit` with the trainer on 2 DDP processes (gloo, CPU): both ranks end every step with the same
weights, rank 0's published weights are those weights, and the training equals a single process's on
the same batches.

The DDP run keeps every batch; a single-process `grpokit train` then replays them (RecordedRollouts).
Each step has 3 micro-batches, so the ranks train 2 and 1 (an uneven share, with no_sync on rank 0's
first backward).
"""

import json
import subprocess
import sys
from collections import Counter

import pytest
from safetensors.torch import load_file

from grpokit.common.checksums import tensors_sha256
from grpokit.common.timeline import read_timeline
from grpokit.sweep.recording import export
from grpokit.testing import tiny_fit_argv
from grpokit.transport.codec import decode_batch
from tests.support import read_metrics

STEPS = 3
KEEP_BATCHES = '{"class_path": "FilesystemTransport", "init_args": {"keep_last": 0}}'
COMMON = (
    "--trainer.max_steps",
    str(STEPS),
    "--data.eval",
    "null",
    "--num_threads",
    "1",
    "--trainer.callbacks+=grpokit.trainer.callbacks.RankChecksums",
)


def run(argv: list[str], log_path) -> None:
    with open(log_path, "w") as log:
        code = subprocess.run(
            [sys.executable, "-m", "grpokit", *argv], stdout=log, stderr=subprocess.STDOUT, timeout=400
        ).returncode
    assert code == 0, log_path.read_text()[-4000:]


def checksums(run_dir, rank: int) -> dict[int, str]:
    lines = (run_dir / "rank_checksums" / f"rank_{rank}.jsonl").read_text().splitlines()
    return {json.loads(line)["step"]: json.loads(line)["sha256"] for line in lines}


def losses(run_dir) -> list[float]:
    return [float(r["loss"]) for r in read_metrics(run_dir)]


def test_two_ddp_ranks_train_identically_and_match_one_process(tmp_path, tiny_model):
    ddp = (
        "--trainer.strategy",
        "ddp",
        "--trainer.devices",
        "2",
        "--trainer.accelerator",
        "cpu",
        "--data.transport",
        KEEP_BATCHES,
        "--ckpt.interval",
        "2",
    )
    run(tiny_fit_argv(tmp_path, tiny_model, "ddp", *COMMON, *ddp), tmp_path / "ddp.log")
    run_dir = tmp_path / "ddp"
    assert [
        len(decode_batch((run_dir / "rollouts" / f"step_{s}.safetensors").read_bytes()).micro_batches)
        for s in range(STEPS)
    ] == [3] * STEPS

    # every step, both ranks hold bit-identical weights, and rank 0 published exactly them
    assert checksums(run_dir, 0) == checksums(run_dir, 1)
    assert sorted(checksums(run_dir, 0)) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        assert (
            tensors_sha256(load_file(run_dir / "broadcasts" / f"step_{step}" / "adapter_model.safetensors"))
            == checksums(run_dir, 0)[step]
        )
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("*.ckpt")) == [
        "step_2.ckpt",
        "step_3.ckpt",
    ]  # rank 0 wrote them
    samples = Counter(json.loads(line)["step"] for line in (run_dir / "samples.jsonl").read_text().splitlines())
    assert samples == {step: 4 for step in range(STEPS)}  # one orchestrator (rank 0's), 4 logged samples per step
    assert Counter(r["step"] for r in read_timeline(run_dir) if r["role"] == "trainer") == {
        step: 1 for step in range(STEPS)
    }

    # one process training on the same batches gets the same weights, up to float summation order
    replay = (
        "--data.transport",
        json.dumps(
            {"class_path": "RecordedRollouts", "init_args": {"path": str(export(run_dir, tmp_path / "rec", STEPS))}}
        ),
    )
    run(tiny_fit_argv(tmp_path, tiny_model, "one", *COMMON, *replay, command="train"), tmp_path / "one.log")
    ddp_weights = load_file(run_dir / "broadcasts" / f"step_{STEPS}" / "adapter_model.safetensors")
    one_weights = load_file(tmp_path / "one" / "broadcasts" / f"step_{STEPS}" / "adapter_model.safetensors")
    assert (
        max(float(ddp_weights[k].abs().max()) for k in ddp_weights if "lora_B" in k) > 1e-4
    )  # they trained (B starts at 0)
    assert max(float((ddp_weights[k] - one_weights[k]).abs().max()) for k in ddp_weights) < 1e-6
    assert losses(run_dir) == pytest.approx(
        losses(tmp_path / "one"), rel=1e-4, abs=1e-6
    )  # rank 0 logs the whole step's loss
