"""IPC broadcast: zero-copy views of the trainer's tensors in shared memory, bit-identical across processes."""

import hashlib
import json
import subprocess
import sys
import textwrap

import torch

from grpokit.broadcast.ipc import IPCBroadcast
from grpokit.types import WeightUpdate


def update(step: int) -> WeightUpdate:
    g = torch.Generator().manual_seed(step)
    return WeightUpdate(
        step=step,
        tensors={
            "a.lora_A.weight": torch.randn(16, 64, generator=g),
            "a.lora_B.weight": torch.randn(64, 16, generator=g).to(torch.bfloat16),
            "scalar": torch.tensor(float(step)),
            "empty": torch.empty(0),
        },
        lora_config={"r": 16, "peft_type": "LORA"},
    )


def digest(t: torch.Tensor) -> str:
    return (
        hashlib.sha256(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
        if t.numel()
        else "empty"
    )


def test_round_trip_views_and_pruning(tmp_path):
    b = IPCBroadcast(keep_last=2)
    b.setup(tmp_path)
    try:
        assert b.poll(-1) is None
        for s in range(4):
            b.publish(update(s))
        got = b.poll(-1)
        assert got.step == 3 and got.lora_config == {"r": 16, "peft_type": "LORA"}
        for name, t in update(3).tensors.items():
            assert got.tensors[name].dtype == t.dtype and torch.equal(got.tensors[name], t)
        assert b.poll(3) is None
        assert sorted(p.name for p in (tmp_path / "broadcasts_ipc").iterdir()) == ["step_2.json", "step_3.json"]
    finally:
        b.close()
    assert not list((tmp_path / "broadcasts_ipc").iterdir())


def test_another_process_reads_bit_identical_tensors(tmp_path):
    b = IPCBroadcast()
    b.setup(tmp_path)
    try:
        b.publish(update(5))
        expected = {k: digest(v) for k, v in update(5).tensors.items()}
        script = textwrap.dedent(f"""
            import hashlib, json, torch
            from grpokit.broadcast.ipc import IPCBroadcast
            b = IPCBroadcast(); b.setup({str(tmp_path)!r})
            u = b.poll(-1)
            d = lambda t: (
                hashlib.sha256(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
                if t.numel() else "empty"
            )
            print(json.dumps({{"step": u.step, "digests": {{k: d(v) for k, v in u.tensors.items()}}}}))
        """)
        out = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
        ).stdout
        got = json.loads(out.strip().splitlines()[-1])
        assert got["step"] == 5 and got["digests"] == expected
    finally:
        b.close()


def test_tensors_changed_in_shared_memory_are_refused_naming_the_step(tmp_path):
    """The index carries the trainer's fingerprints of what it wrote (grpokit.common.checksums); a reader
    in another broadcast object (the engine's process) that maps bytes changed since is refused."""
    from multiprocessing import shared_memory

    import pytest

    writer, reader = IPCBroadcast(), IPCBroadcast()
    writer.setup(tmp_path)
    reader.setup(tmp_path)
    try:
        writer.publish(update(1))
        got = reader.poll(-1)  # kept: its views need the mapping it holds
        assert torch.equal(got.tensors["scalar"], torch.tensor(1.0))  # unchanged: read
        index = json.loads((tmp_path / "broadcasts_ipc" / "step_1.json").read_text())
        segment = shared_memory.SharedMemory(name=index["segment"])
        segment.buf[index["tensors"][0]["offset"] + 3] ^= 0xFF
        segment.close()
        with pytest.raises(RuntimeError, match="IPCBroadcast step 1: 1 tensors"):
            reader.poll(-1)
    finally:
        writer.close()
