"""`grpokit fit` with the trainer sharded over 2 processes by FSDP2 (`trainer.strategy: fsdp2`, gloo, CPU),
full fine-tuning: rank 0 publishes the gathered weights every step, writes one full checkpoint file, and a
single process resumed from that checkpoint trains the next step to the same weights.

Each step has 3 micro-batches, so rank 1 trains 1 and a zero-loss stand-in beside rank 0's 2 (every FSDP
forward and backward is a collective). The single-process resume loads the FSDP checkpoint (weights,
AdamW moments, LR schedule) and trains step 2's kept batch again: its step-3 weights must equal the
sharded run's up to float summation order, and so must the step's loss.

The first test runs the trainer's CUDA defaults (varlen attention, chunked logprobs) on the CPU.
GRPOKIT_TEST_ACCELERATOR=gpu runs the same check on 2 GPUs over NCCL (bench/gpu_check_fsdp.sh).
"""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from grpokit.common.checksums import tensors_sha256
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
    "--model.lora",
    "null",
    "--data.transport",
    KEEP_BATCHES,
    "--ckpt.interval",
    "2",
    "--trainer.accelerator",
    os.environ.get("GRPOKIT_TEST_ACCELERATOR", "cpu"),
)


def run(argv: list[str], log_path) -> None:
    with open(log_path, "w") as log:
        code = subprocess.run(
            [sys.executable, "-m", "grpokit", *argv], stdout=log, stderr=subprocess.STDOUT, timeout=400
        ).returncode
    assert code == 0, log_path.read_text()[-4000:]


def loss_at(run_dir, step: int) -> float:
    return next(float(r["loss"]) for r in read_metrics(run_dir) if int(r["step"]) == step)


# The trainer's CUDA defaults, on the CPU: varlen attention (its CPU twin) and chunked logprobs through
# the sharded root's forward (calling the decoder and the head apart failed on a sharded model).
CUDA_DEFAULTS = ("--model.attention", "varlen", "--model.logprob_chunk_size", "16")


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory, tiny_model):
    """One 3-step 2-rank FSDP2 run (checkpoints at steps 2 and 3), shared by the tests below: they copy
    its folder before running anything in it, so each starts from the same finished run."""
    out = tmp_path_factory.mktemp("fsdp")
    fsdp = (
        "--trainer.strategy",
        "fsdp2",
        "--trainer.devices",
        "2",
        "--trainer.callbacks+=grpokit.trainer.callbacks.RankChecksums",
    )
    run(tiny_fit_argv(out, tiny_model, "fsdp", *COMMON, *CUDA_DEFAULTS, *fsdp), out / "fsdp.log")
    return out / "fsdp"


def test_fsdp2_full_fine_tuning_publishes_and_resumes_on_one_process(tmp_path, tiny_model, fsdp_run):
    run_dir = fsdp_run
    assert [
        len(decode_batch((run_dir / "rollouts" / f"step_{s}.safetensors").read_bytes()).micro_batches)
        for s in range(STEPS)
    ] == [3] * STEPS

    # rank 0 published the gathered full weights of every step; only it wrote checksums (ranks hold shards)
    published = {s: load_file(run_dir / "broadcasts" / f"step_{s}" / "model.safetensors") for s in range(STEPS + 1)}
    base = load_file(f"{tiny_model}/model.safetensors")
    assert all(torch.equal(published[0][k], base[k]) for k in base)  # step 0: the model as loaded (+ the tied lm_head)
    assert max(float((published[STEPS][k] - base[k]).abs().max()) for k in base) > 1e-4  # it trained every weight
    lines = [json.loads(line) for line in (run_dir / "rank_checksums" / "rank_0.jsonl").read_text().splitlines()]
    assert {line["step"]: line["sha256"] for line in lines} == {
        s: tensors_sha256(published[s]) for s in range(1, STEPS + 1)
    }
    assert not (run_dir / "rank_checksums" / "rank_1.jsonl").exists()

    # one checkpoint file per step (the full state, assembled on rank 0)
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("*")) == ["step_2.ckpt", "step_3.ckpt"]
    state = torch.load(run_dir / "checkpoints" / "step_2.ckpt", map_location="cpu", weights_only=True)
    assert sorted(state["state_dict"]) == sorted(
        f"lm.{k}" for k in base
    )  # the trainable weights (the tied head is the embedding)
    assert len(state["optimizer_states"][0]["state"]) == len(base)  # AdamW moments of every weight

    # one process resumed from the sharded run's step-2 checkpoint trains step 2's kept batch to the same weights
    sharded_step3, sharded_loss = published[STEPS], loss_at(run_dir, 2)
    single = tmp_path / "single"
    shutil.copytree(run_dir, single)
    run(
        tiny_fit_argv(tmp_path, tiny_model, "single", *COMMON, *CUDA_DEFAULTS, "--ckpt.resume_step", "2"),
        tmp_path / "single.log",
    )
    resumed = load_file(single / "broadcasts" / f"step_{STEPS}" / "model.safetensors")
    assert max(float((resumed[k] - sharded_step3[k]).abs().max()) for k in base) < 1e-6
    assert loss_at(single, 2) == pytest.approx(sharded_loss, rel=1e-5, abs=1e-7)


def test_fsdp2_restarts_the_count_from_a_checkpoint_on_every_rank(tmp_path, tiny_model, fsdp_run):
    """ckpt.skip_progress with 2 ranks: rank 0 archives the earlier count before the other rank starts,
    which then finds the checkpoint in the archive; every rank loads its shards of the weights, and the
    new count's step 0 publishes exactly them. The earlier count is the shared 2-rank run (newest
    checkpoint: step 3), copied."""
    fsdp = ("--trainer.strategy", "fsdp2", "--trainer.devices", "2")
    run_dir = tmp_path / "count"
    shutil.copytree(fsdp_run, run_dir)
    trained = load_file(run_dir / "broadcasts" / f"step_{STEPS}" / "model.safetensors")
    restart = ("--ckpt.resume_step", "-1", "--ckpt.skip_progress", "true", "--trainer.max_steps", "1")
    run(tiny_fit_argv(tmp_path, tiny_model, "count", *COMMON, *fsdp, *restart), tmp_path / "restart.log")
    (archive,) = (run_dir / "archive").iterdir()
    assert (archive / "checkpoints" / f"step_{STEPS}.ckpt").exists()
    restarted = load_file(run_dir / "broadcasts" / "step_0" / "model.safetensors")
    assert all(torch.equal(restarted[k], trained[k]) for k in trained)
    assert sorted(int(d.name[5:]) for d in (run_dir / "broadcasts").glob("step_*")) == [0, 1]


def test_fsdp2_run_killed_mid_training_resumes_to_the_end(tmp_path, tiny_model):
    """SIGKILL of the whole 2-rank FSDP2 run (both processes, as a crashed node) after a checkpoint
    exists, then `--ckpt.resume_step -1` on 2 ranks again: every step is trained exactly once in the
    end, and the final weights are published."""
    import signal
    import time

    steps, run_dir = 6, tmp_path / "kill"
    argv = tiny_fit_argv(
        tmp_path,
        tiny_model,
        "kill",
        *COMMON,
        "--trainer.strategy",
        "fsdp2",
        "--trainer.devices",
        "2",
        "--trainer.max_steps",
        str(steps),
    )
    with open(tmp_path / "killed.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "grpokit", *argv], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 300
        while not (
            (run_dir / "checkpoints" / "step_2.ckpt").exists()
            and (run_dir / "broadcasts" / "step_3" / "STABLE").exists()
        ):
            assert proc.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint after 300 s"
            time.sleep(0.05)
    finally:
        alive = proc.poll() is None
        os.killpg(proc.pid, signal.SIGKILL)  # rank 0 and the rank Lightning started
        proc.wait()
    assert alive and not (run_dir / "checkpoints" / f"step_{steps}.ckpt").exists()  # killed mid-run
    run(argv + ["--ckpt.resume_step", "-1"], tmp_path / "resumed.log")
    logged = [int(r["step"]) for r in read_metrics(run_dir)]
    assert sorted(logged) == list(range(steps))  # each step once: the resumed run rewrote the rows after its checkpoint
    assert (run_dir / "broadcasts" / f"step_{steps}" / "STABLE").exists() and (
        run_dir / "checkpoints" / f"step_{steps}.ckpt"
    ).exists()
