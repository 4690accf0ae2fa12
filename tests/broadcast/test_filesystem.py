"""Filesystem broadcast: STABLE-gated reads, pruning, a poller racing a publisher, and retention that
never deletes a step a reader has not acknowledged."""

import os
import re
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from grpokit.broadcast.filesystem import ADAPTER_CONFIG, ADAPTER_FILE, STABLE, DamagedStepError, FilesystemBroadcast
from grpokit.types import WeightUpdate


def update(step: int, size: int = 1000) -> WeightUpdate:
    return WeightUpdate(
        step=step,
        tensors={
            "a.lora_A.weight": torch.full((size, 64), float(step)),
            "a.lora_B.weight": torch.full((64, size), float(step)),
        },
        lora_config={"r": 8, "peft_type": "LORA"},
    )


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


# -- retention: never delete a step a reader has not acknowledged ------------------------------------


def load_from_path(got: WeightUpdate) -> torch.Tensor:
    """What a path-based engine (vLLM) does: read the adapter files itself, after poll returned."""
    return load_file(Path(got.path) / ADAPTER_FILE)["a.lora_A.weight"]


def test_a_slow_reader_keeps_its_step_while_the_writer_runs_ahead(tmp_path):
    writer, reader = FilesystemBroadcast(keep_last=2), FilesystemBroadcast(keep_last=2)
    writer.setup(tmp_path)
    reader.setup(tmp_path)
    writer.publish(update(0, size=8))
    got = reader.poll(-1)  # acknowledges -1: it holds nothing yet, so every step stays
    for s in range(1, 11):
        writer.publish(update(s, size=8))
    assert torch.all(load_from_path(got) == 0)  # without the ack, steps 0..8 would be gone
    assert writer.stable_steps() == list(range(11))
    got = reader.poll(got.step)  # loaded step 0; now it loads 10
    assert got.step == 10
    writer.publish(update(11, size=8))
    assert writer.stable_steps() == list(range(12))  # the reader's ack is still 0: every step from 0 on stays
    reader.poll(10)  # loaded step 10
    writer.publish(update(12, size=8))
    assert writer.stable_steps() == [10, 11, 12]  # older than keep_last and than the oldest ack: deleted


def test_without_an_ack_the_step_is_deleted_under_the_reader(tmp_path):
    """The race the acknowledgements close: a reader whose ack is withdrawn loses its step."""
    writer, reader = FilesystemBroadcast(keep_last=2), FilesystemBroadcast(keep_last=2)
    writer.setup(tmp_path)
    reader.setup(tmp_path)
    writer.publish(update(0, size=8))
    got = reader.poll(-1)
    reader.close()  # withdraws the ack
    for s in range(1, 4):
        writer.publish(update(s, size=8))
    with pytest.raises(FileNotFoundError):
        load_from_path(got)


def test_a_dead_readers_ack_stops_holding_steps_after_reader_timeout(tmp_path):
    writer, reader = FilesystemBroadcast(keep_last=2, reader_timeout=60), FilesystemBroadcast(keep_last=2)
    writer.setup(tmp_path)
    reader.setup(tmp_path)
    writer.publish(update(0, size=8))
    reader.poll(-1)
    writer.publish(update(1, size=8))
    writer.publish(update(2, size=8))
    assert writer.stable_steps() == [0, 1, 2]
    old = time.time() - 120
    os.utime(reader.ack_path, (old, old))  # no poll for 2 minutes: the reader is presumed dead
    writer.publish(update(3, size=8))
    assert writer.stable_steps() == [2, 3]


def test_reader_slower_than_writer_never_loses_a_step_in_a_real_race(tmp_path):
    """Writer thread publishing as fast as it can; a reader that loads each step from its folder only
    after a delay (as vLLM does), so the writer is often more than keep_last steps ahead."""
    writer, reader = FilesystemBroadcast(keep_last=2), FilesystemBroadcast(keep_last=2)
    writer.setup(tmp_path)
    reader.setup(tmp_path)
    steps, gaps = 40, []
    thread = threading.Thread(target=lambda: [writer.publish(update(s, size=64)) for s in range(steps)])
    thread.start()
    loaded = -1
    while loaded < steps - 1:
        got = reader.poll(loaded)
        if got is None:
            time.sleep(0.001)
            continue
        time.sleep(0.06)  # a slow load: ~3x a publish on a busy 2-core machine
        gaps.append(max(writer.stable_steps()) - got.step)
        assert torch.all(load_from_path(got) == got.step)
        loaded = got.step
    thread.join()
    assert max(gaps) > 2  # the writer did run more than keep_last steps ahead of a load in progress
    reader.poll(loaded)
    reader.close()
    writer.publish(update(steps, size=64))
    assert writer.stable_steps() == [steps - 1, steps]  # nothing held once the reader is done


def test_discard_after_unlists_and_deletes_newer_steps(tmp_path):
    b = FilesystemBroadcast(keep_last=10)
    b.setup(tmp_path)
    for s in range(5):
        b.publish(update(s, size=8))
    b.discard_after(2)  # a trainer resumed at step 3 publishes 3 and 4 again, its own
    assert b.stable_steps() == [0, 1, 2] and not (tmp_path / "broadcasts" / "step_3").exists()
    b.publish(update(3, size=8))
    assert b.poll(2).step == 3


def test_a_damaged_step_names_the_file(tmp_path):
    """A step whose adapter was cut short, or whose config is not JSON, is refused naming the file
    (safetensors' own error names none); the previous steps stay readable."""
    b = FilesystemBroadcast()
    b.setup(tmp_path)
    b.publish(update(0, size=8))
    b.publish(update(1, size=8))
    adapter = b.step_dir(1) / ADAPTER_FILE
    adapter.write_bytes(adapter.read_bytes()[:100])
    with pytest.raises(DamagedStepError, match=f"{re.escape(str(adapter))} cannot be read .*cut short or corrupt"):
        b.poll(0)
    assert b.read(0).step == 0
    b.publish(update(2, size=8))
    config = b.step_dir(2) / ADAPTER_CONFIG
    config.write_text('{"r": 8,')
    with pytest.raises(DamagedStepError, match=f"{re.escape(str(config))} is not a JSON adapter config"):
        b.poll(1)
