"""Batch files the trainer reads: one holding another step's batch is refused, naming the file and both
steps (it would lose one step and train another twice); a truncated one is refused, naming the file."""

import re
import shutil

import pytest

from grpokit.common.errors import RunDataError
from grpokit.orchestrator import Orchestrator
from grpokit.transport.codec import BatchFormatError
from grpokit.transport.filesystem import FilesystemTransport
from tests.support import assert_same_batch, make_training_batch


def trainer_stream(tmp_path, start_step, max_steps):
    """The trainer's side of a run in tmp_path: its dataloader over the filesystem transport."""
    data = Orchestrator(batch_size=8, rollouts_per_example=4, timeout=5, transport=FilesystemTransport(keep_last=0))
    data.connect_trainer(tmp_path, max_steps=max_steps, start_step=start_step)
    return data, iter(data.train_dataloader())


def test_a_batch_file_holding_another_steps_batch_is_refused(tmp_path):
    data, stream = trainer_stream(tmp_path, start_step=6, max_steps=9)
    for step in (6, 7, 8):
        data.transport.send(make_training_batch(step, tokens=8))
    rollouts = tmp_path / "rollouts"
    shutil.copy(rollouts / "step_8.safetensors", rollouts / "step_7.safetensors")
    assert_same_batch(next(stream), make_training_batch(6, tokens=8))
    with pytest.raises(
        RunDataError,
        match=r"data.transport FilesystemTransport file .*rollouts/step_7.safetensors holds the batch of step 8, "
        r"not of step 7, which the trainer asked for: .*resume the run so that the orchestrator samples step 7",
    ):
        next(stream)


@pytest.mark.parametrize("keep", [5, 0.5], ids=["header", "tensors"])
def test_a_truncated_batch_file_names_its_path(tmp_path, keep):
    data, stream = trainer_stream(tmp_path, start_step=0, max_steps=1)
    data.transport.send(make_training_batch(0, tokens=8))
    path = tmp_path / "rollouts" / "step_0.safetensors"
    raw = path.read_bytes()
    path.write_bytes(raw[: keep if isinstance(keep, int) else int(len(raw) * keep)])
    with pytest.raises(
        BatchFormatError,
        match=rf"batch file {re.escape(str(path))}: (truncated|malformed) .*; delete it and resume the run: "
        r"the orchestrator samples step 0 again",
    ):
        next(stream)
