"""A full disk: every writer fails with an error naming what it could not write, leaves no partial file
behind, and what it wrote before stays whole.

The disk is a 1 MiB tmpfs when this process may mount one (root in CI containers); otherwise writes
fail through a patched os.fsync, the call every grpokit writer makes before its rename.
"""

import errno
import os
import subprocess

import lightning as L
import pytest
import torch

from grpokit.broadcast.filesystem import FilesystemBroadcast
from grpokit.trainer.checkpoint import Checkpointer, CheckpointSettings
from grpokit.transport.filesystem import FilesystemTransport
from grpokit.types import WeightUpdate
from tests.support import assert_same_batch, make_training_batch


class SmallDisk:
    """A folder whose writes fail with ENOSPC after `fill()`."""

    def __init__(self, path, monkeypatch) -> None:
        self.path, self.monkeypatch = path, monkeypatch
        path.mkdir()
        try:
            self.mounted = (
                subprocess.run(
                    ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)], capture_output=True
                ).returncode
                == 0
            )
        except OSError:  # no mount command
            self.mounted = False

    def fill(self) -> None:
        if not self.mounted:

            def full(fd):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

            self.monkeypatch.setattr(os, "fsync", full)
            return
        with open(self.path / "filler", "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError as e:
                assert e.errno == errno.ENOSPC

    def leftovers(self, folder) -> list[str]:
        """Hidden temp files or folders under `folder` (what a failed atomic write could leave)."""
        return [p.name for p in folder.rglob(".*")]

    def close(self) -> None:
        if self.mounted:
            subprocess.run(["umount", str(self.path)], check=True)


@pytest.fixture
def disk(tmp_path, monkeypatch):
    small = SmallDisk(tmp_path / "disk", monkeypatch)
    yield small
    small.close()


def test_a_batch_that_does_not_fit_names_its_file_and_earlier_batches_stay(disk):
    transport = FilesystemTransport(keep_last=0)
    transport.setup(disk.path)
    transport.send(make_training_batch(0, tokens=256))
    disk.fill()
    with pytest.raises(
        OSError, match=r"cannot write .*rollouts/step_1.safetensors \(No space left on device\)"
    ) as info:
        transport.send(make_training_batch(1, tokens=4096))
    assert info.value.errno == errno.ENOSPC
    assert_same_batch(transport.receive(0, timeout=1), make_training_batch(0, tokens=256))
    assert not transport.has(1) and disk.leftovers(disk.path / "rollouts") == []


def test_weights_that_do_not_fit_leave_the_previous_step_loadable(disk):
    broadcast = FilesystemBroadcast()
    broadcast.setup(disk.path)

    def update(step, n):
        return WeightUpdate(
            step=step, tensors={"a.lora_A.weight": torch.full((n, 64), float(step))}, lora_config={"r": 8}
        )

    broadcast.publish(update(0, 16))
    disk.fill()
    with pytest.raises(OSError, match="No space left on device"):
        broadcast.publish(update(1, 4096))
    assert broadcast.stable_steps() == [0] and torch.all(broadcast.poll(-1).tensors["a.lora_A.weight"] == 0)
    assert [n for n in disk.leftovers(disk.path / "broadcasts") if n != "acks"] == []


class Linear(L.LightningModule):
    """One linear layer, trained a step so the Lightning trainer has a model and an optimizer to save."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(64, 64)

    def training_step(self, batch, batch_idx):
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters())

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.randn(4, 64), batch_size=2)


def test_a_checkpoint_that_does_not_fit_leaves_no_partial_file_and_the_previous_one_loads(disk, tmp_path):
    trainer = L.Trainer(
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(Linear())
    checkpointer = Checkpointer(disk.path / "checkpoints", CheckpointSettings(interval=1, keep_last=5))
    checkpointer.save(trainer, 1)
    disk.fill()
    with pytest.raises(OSError):
        for step in range(2, 200):  # the tmpfs has a little room left after fill(); the patched fsync none
            checkpointer.save(trainer, step)
    assert (
        torch.load(disk.path / "checkpoints" / "step_1.ckpt", map_location="cpu", weights_only=False)["global_step"]
        == 1
    )
    assert disk.leftovers(disk.path / "checkpoints") == []
