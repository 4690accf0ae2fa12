"""Filesystem broadcast: STABLE-gated reads, pruning, and a poller racing a publisher."""

import threading

import torch

from grpokit.broadcast.filesystem import STABLE, FilesystemBroadcast
from grpokit.types import WeightUpdate


def update(step: int, size: int = 1000) -> WeightUpdate:
    return WeightUpdate(step=step, tensors={"a.lora_A.weight": torch.full((size, 64), float(step)), "a.lora_B.weight": torch.full((64, size), float(step))}, lora_config={"r": 8, "peft_type": "LORA"})


def test_publish_poll_round_trip(tmp_path):
    b = FilesystemBroadcast()
    b.setup(tmp_path)
    assert b.poll(-1) is None
    b.publish(update(0))
    got = b.poll(-1)
    assert got.step == 0 and got.lora_config == {"r": 8, "peft_type": "LORA"}
    assert torch.equal(got.tensors["a.lora_A.weight"], update(0).tensors["a.lora_A.weight"])
    assert b.poll(0) is None  # nothing newer


def test_unstable_folder_is_invisible(tmp_path):
    b = FilesystemBroadcast()
    b.setup(tmp_path)
    b.publish(update(1))
    (tmp_path / "broadcasts" / "step_1" / STABLE).unlink()
    assert b.poll(-1) is None


def test_keeps_only_the_newest_steps(tmp_path):
    b = FilesystemBroadcast(keep_last=2)
    b.setup(tmp_path)
    for s in range(5):
        b.publish(update(s, size=8))
    assert b.stable_steps() == [3, 4]


def test_poller_racing_publisher_sees_whole_consistent_updates(tmp_path):
    writer, reader = FilesystemBroadcast(keep_last=2), FilesystemBroadcast(keep_last=2)
    writer.setup(tmp_path)
    reader.setup(tmp_path)
    steps, seen = 25, []

    def publish_all():
        for s in range(steps):
            writer.publish(update(s, size=4000))

    thread = threading.Thread(target=publish_all)
    thread.start()
    last = -1
    while last < steps - 1:
        got = reader.poll(last)
        if got is None:
            continue
        # every tensor of an update carries its own step: a mix of two steps or a torn file fails here
        assert all(torch.all(t == got.step) for t in got.tensors.values())
        assert got.step > last
        seen.append(got.step)
        last = got.step
    thread.join()
    assert seen[-1] == steps - 1
