"""NCCLBroadcast: header validation, bucket packing, and a real 2-process exchange over gloo.

The 2-process test runs this file as a script, once per rank: rank 0 writes the sha256 of every tensor
it publishes, rank 1 checks that what it received hashes the same (engine weights bit-identical to the
trainer's after each step).
"""

import hashlib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from grpokit.broadcast.nccl import (
    Header,
    NCCLBroadcast,
    TensorSpec,
    as_bytes,
    buckets,
    copy_bucket,
    decode_header,
    encode_header,
)
from grpokit.testing import free_port
from grpokit.types import WeightUpdate

LORA_CONFIG = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"], "peft_type": "LORA"}


def make_update(step: int) -> WeightUpdate:
    g = torch.Generator().manual_seed(step)
    tensors = {
        "q_proj.lora_A.weight": torch.randn(8, 64, generator=g),
        "q_proj.lora_B.weight": torch.randn(64, 8, generator=g).to(torch.bfloat16),
        "v_proj.lora_A.weight": torch.randn(8, 33, generator=g).to(torch.float16),  # odd byte count
        "big.lora_B.weight": torch.randn(700_001, generator=g),  # ~2.7 MiB: 3 buckets of 1 MiB
        "scalar": torch.tensor(float(step)),
        "empty": torch.zeros(0, 4),
    }
    return WeightUpdate(step=step, tensors=tensors, lora_config=LORA_CONFIG)


def sha(t: torch.Tensor) -> str:
    return hashlib.sha256(as_bytes(t.contiguous().cpu()).numpy().tobytes()).hexdigest()


# -- unit level ------------------------------------------------------------------------------------


def test_header_round_trip():
    specs = [TensorSpec("a", torch.bfloat16, (3, 4)), TensorSpec("b", torch.float32, ())]
    h = Header(step=7, lora_config=LORA_CONFIG, bucket_bytes=1024, specs=specs)
    assert decode_header(encode_header(h)) == h
    assert h.total_bytes == 3 * 4 * 2 + 4


GOOD = {
    "version": 1,
    "step": 0,
    "lora_config": None,
    "bucket_bytes": 16,
    "tensors": [{"name": "a", "dtype": "float32", "shape": [2]}],
}


@pytest.mark.parametrize(
    "raw, match",
    [
        (b"\xff\xfe", "not UTF-8 JSON"),
        (b"{not json", "not UTF-8 JSON"),
        (b"[1, 2]", "version"),
        (json.dumps({**GOOD, "version": 2}).encode(), "version"),
        (json.dumps({**GOOD, "step": -1}).encode(), "step"),
        (json.dumps({**GOOD, "step": True}).encode(), "step"),
        (json.dumps({**GOOD, "lora_config": [1]}).encode(), "lora_config"),
        (json.dumps({**GOOD, "bucket_bytes": 0}).encode(), "bucket_bytes"),
        (json.dumps({**GOOD, "tensors": {}}).encode(), "tensors must be a list"),
        (
            json.dumps({**GOOD, "tensors": [{"name": "a", "dtype": "object", "shape": [2]}]}).encode(),
            "unsupported dtype",
        ),
        (json.dumps({**GOOD, "tensors": [{"name": "a", "dtype": "float32", "shape": [-1]}]}).encode(), "bad shape"),
        (json.dumps({**GOOD, "tensors": [{"name": "a", "dtype": "float32", "shape": 2}]}).encode(), "bad shape"),
        (json.dumps({**GOOD, "tensors": [{"dtype": "float32", "shape": [2]}]}).encode(), "bad tensor entry"),
        (json.dumps({**GOOD, "tensors": GOOD["tensors"] * 2}).encode(), "duplicate"),
    ],
)
def test_malformed_header_is_rejected(raw, match):
    with pytest.raises(ValueError, match=match):
        decode_header(raw)


def test_buckets_cover_the_bytes_once():
    assert buckets(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert buckets(8, 4) == [(0, 4), (4, 8)]
    assert buckets(0, 4) == []


def test_bucketed_copy_round_trip_is_bit_identical():
    sent = make_update(3).tensors
    got = {k: torch.empty_like(v) for k, v in sent.items()}
    src, dst = [as_bytes(t) for t in sent.values()], [as_bytes(t) for t in got.values()]
    total = sum(t.numel() for t in src)
    for start, end in buckets(total, 1000):  # boundaries fall inside tensors and inside elements
        bucket = torch.empty(end - start, dtype=torch.uint8)
        copy_bucket(src, start, end, bucket, into_bucket=True)
        copy_bucket(dst, start, end, bucket, into_bucket=False)
    assert all(sha(got[k]) == sha(sent[k]) and got[k].dtype == sent[k].dtype for k in sent)


def fake_wire(b: NCCLBroadcast, messages: list[torch.Tensor]) -> None:
    """Stand in for the group: each broadcast receives the next message."""
    b._connect = lambda: None
    b._broadcast = lambda t: t.copy_(messages.pop(0))


def test_receiver_rejects_a_malformed_header_and_poll_raises():
    raw = b'{"version": 1, "step": "x"}'
    b = NCCLBroadcast(backend="gloo")
    b._take_role(1)
    fake_wire(b, [torch.tensor([len(raw)]), torch.frombuffer(bytearray(raw), dtype=torch.uint8)])
    b._receive_loop()
    b._thread = object()  # the loop already ran; poll must not start another
    with pytest.raises(RuntimeError, match="receiver stopped") as e:
        b.poll(-1)
    assert "step must be an int" in str(e.value.__cause__)


def test_receiver_rejects_an_oversized_header_length():
    b = NCCLBroadcast(backend="gloo")
    b._take_role(1)
    fake_wire(b, [torch.tensor([1 << 40])])
    b._receive_loop()
    assert isinstance(b._error, ValueError) and "header length" in str(b._error)


def test_one_instance_cannot_be_both_ends():
    b = NCCLBroadcast(backend="gloo")
    b._take_role(1)
    with pytest.raises(RuntimeError, match="not both"):
        b.publish(make_update(0))


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="backend"):
        NCCLBroadcast(backend="mpi")
    with pytest.raises(ValueError, match="bucket_mb"):
        NCCLBroadcast(bucket_mb=0)


# -- two processes over gloo -----------------------------------------------------------------------


def wait_for(path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.01)


def trainer(port: int, d: Path) -> None:
    b = NCCLBroadcast(port=port, backend="gloo", bucket_mb=1, timeout=60)
    for step in range(3):
        u = make_update(step)
        (d / f"sha_{step}.json").write_text(json.dumps({k: sha(t) for k, t in u.tensors.items()}))
        b.publish(u)
        wait_for(d / f"ack_{step}")  # so the engine sees every step, not only the newest
    b.close()


def engine(port: int, d: Path) -> None:
    b = NCCLBroadcast(port=port, backend="gloo", timeout=60)  # its own bucket_mb is unused: the header's wins
    last, deadline = -1, time.monotonic() + 60
    while last < 2 and time.monotonic() < deadline:
        u = b.poll(last)
        if u is None:
            time.sleep(0.005)
            continue
        want = json.loads((d / f"sha_{u.step}.json").read_text())
        got = {k: sha(t) for k, t in u.tensors.items()}
        sent = make_update(u.step)
        assert got == want, f"step {u.step}: checksums differ"
        assert u.lora_config == LORA_CONFIG and list(u.tensors) == list(sent.tensors)
        assert all(u.tensors[k].dtype == t.dtype and u.tensors[k].shape == t.shape for k, t in sent.tensors.items())
        assert u.step == last + 1, f"got step {u.step} after {last}"
        (d / f"ack_{u.step}").touch()
        last = u.step
    b._thread.join(timeout=30)  # the trainer's close() ends the receiver
    assert not b._thread.is_alive() and b._error is None
    b.close()
    assert last == 2, f"engine stopped at step {last}"


def poll_until(b: NCCLBroadcast, after_step: int, timeout: float = 30.0) -> WeightUpdate:
    deadline = time.monotonic() + timeout
    while (u := b.poll(after_step)) is None:
        assert time.monotonic() < deadline, f"no step after {after_step}"
        time.sleep(0.01)
    return u


def test_a_second_engine_is_refused_and_the_first_keeps_receiving():
    """Two processes polling as the engine (the orchestrator and the server did, before the orchestrator
    asked the server instead) broke the group for both; the second is now refused before it joins."""
    port = free_port()
    trainer = NCCLBroadcast(port=port, backend="gloo", timeout=30)
    first, second = (
        NCCLBroadcast(port=port, backend="gloo", timeout=30),
        NCCLBroadcast(port=port, backend="gloo", timeout=30),
    )
    publisher = threading.Thread(target=trainer.publish, args=(make_update(0),))
    publisher.start()  # blocks until an engine joins
    assert poll_until(first, -1).step == 0
    publisher.join()
    with pytest.raises(
        RuntimeError, match=r"already has its engine: it reaches exactly one.*inference.init_args.base_url"
    ):
        second.poll(-1)  # starts its receiver, which is refused: at once when it was quick, else at the next poll
        second._thread.join(timeout=30)
        second.poll(-1)
    trainer.publish(make_update(1))
    assert poll_until(first, 0).step == 1
    trainer.close()
    first.close()
    second.close()


def test_two_processes_over_gloo_receive_bit_identical_weights(tmp_path):
    port = free_port()
    procs = [
        subprocess.Popen([sys.executable, __file__, role, str(port), str(tmp_path)], stderr=subprocess.PIPE, text=True)
        for role in ("trainer", "engine")
    ]
    try:
        errs = [p.communicate(timeout=90)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(errs)
    assert sorted(f.name for f in tmp_path.glob("ack_*")) == ["ack_0", "ack_1", "ack_2"]


if __name__ == "__main__":
    {"trainer": trainer, "engine": engine}[sys.argv[1]](int(sys.argv[2]), Path(sys.argv[3]))


def test_the_receiver_keeps_steps_the_engine_has_not_passed():
    """data.deterministic: poll(after_step, upto) hands out the newest received step up to `upto`, though a
    newer one has arrived; the steps the engine has passed are forgotten."""
    b = NCCLBroadcast(backend="gloo")
    b._take_role(1)
    b._thread = object()  # no receiver thread: the received updates are put in by hand
    b._received = {s: WeightUpdate(step=s, tensors={"w": torch.tensor(float(s))}) for s in (1, 2, 3)}
    assert b.poll(0, upto=1).step == 1
    assert b.poll(1, upto=2).step == 2 and sorted(b._received) == [2, 3]
    assert b.poll(2, upto=2) is None
    assert b.poll(2).step == 3  # without a bound: the newest
    assert b.poll(3) is None and b._received == {}


def sent_messages(update: WeightUpdate) -> list[torch.Tensor]:
    """What a trainer's publish of `update` broadcasts, message by message (its group stood in for)."""
    sent: list[torch.Tensor] = []
    b = NCCLBroadcast(backend="gloo", bucket_mb=1)
    b._take_role(0)
    b._pg = object()  # connected
    b._broadcast = lambda t: sent.append(t.clone())
    b.publish(update)
    return sent


def test_a_bucket_damaged_in_transit_stops_the_receiver_naming_the_step():
    """The header carries the sender's fingerprints of the tensors (grpokit.common.checksums); the engine
    recomputes them on what arrived: one flipped byte in a bucket, and poll raises naming the step."""
    messages = sent_messages(make_update(5))
    good = NCCLBroadcast(backend="gloo")
    good._take_role(1)
    fake_wire(good, [m.clone() for m in messages])
    assert good._receive_one().step == 5  # undamaged: received
    messages[2][7] ^= 0xFF  # a byte of the first bucket
    b = NCCLBroadcast(backend="gloo")
    b._take_role(1)
    fake_wire(b, messages + [torch.zeros(1, dtype=torch.int64)])
    b._receive_loop()
    b._thread = object()  # the loop already ran; poll must not start another
    with pytest.raises(RuntimeError, match="receiver stopped") as e:
        b.poll(-1)
    assert "step 5" in str(e.value.__cause__) and "arrived different" in str(e.value.__cause__)
