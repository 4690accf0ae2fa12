"""Temp folders a killed publish leaves in broadcasts/ (`.step_N.<pid>.tmp`): the trainer deletes them when
it starts publishing (discard_after); a reader starting meanwhile leaves them, since one may be a live
writer's step in progress."""

import torch

from grpokit.broadcast.filesystem import ADAPTER_FILE, FilesystemBroadcast
from grpokit.types import WeightUpdate


def update(step: int) -> WeightUpdate:
    return WeightUpdate(step=step, tensors={"a.lora_A.weight": torch.full((8, 64), float(step))}, lora_config={"r": 8})


def half_published(root, step: int):
    """What a publish killed inside atomic_folder leaves: its temp folder, holding part of the files."""
    tmp = root / f".step_{step}.4242.tmp"
    tmp.mkdir(parents=True)
    (tmp / ADAPTER_FILE).write_bytes(b"half an adapter")
    return tmp


def test_the_writers_start_deletes_a_killed_publishs_temp_folder_and_a_readers_does_not(tmp_path):
    writer = FilesystemBroadcast()
    writer.setup(tmp_path)
    writer.publish(update(0))
    tmp = half_published(writer.root, 1)

    reader = FilesystemBroadcast()
    reader.setup(tmp_path)
    assert reader.poll(-1).step == 0 and tmp.is_dir()  # invisible to readers, and not theirs to delete

    restarted = FilesystemBroadcast()
    restarted.setup(tmp_path)
    restarted.discard_after(0)  # a trainer resuming at step 1
    assert not tmp.exists() and restarted.stable_steps() == [0]
    restarted.publish(update(1))
    assert sorted(p.name for p in restarted.root.iterdir()) == ["acks", "step_0", "step_1"]
