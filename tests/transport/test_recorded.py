"""RecordedRollouts: exported batches come back identical, checksum-verified; tampering and missing steps
fail clearly."""

import json

import pytest

from grpokit.sweep.recording import export
from grpokit.transport.codec import BatchFormatError
from grpokit.transport.filesystem import FilesystemTransport
from grpokit.transport.recorded import RecordedRollouts, batch_file
from tests.support import assert_same_batch, make_training_batch


def recorded_run(tmp_path, steps: int = 3):
    """A run folder whose filesystem transport kept every batch, exported to tmp_path/recorded."""
    run = tmp_path / "run"
    sender = FilesystemTransport(keep_last=0)
    sender.setup(run)
    for step in range(steps):
        sender.send(make_training_batch(step))
    (run / "config.yaml").write_text("data: {batch_size: 8}\n")
    return export(run, tmp_path / "recorded", steps)


def test_replay_returns_the_recorded_batches_and_logs_their_checksums(tmp_path):
    folder = recorded_run(tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    (tmp_path / "variant").mkdir()
    replay = RecordedRollouts(str(folder))
    replay.setup(tmp_path / "variant")
    for step in range(3):
        assert replay.has(step)
        assert_same_batch(replay.receive(step, timeout=0), make_training_batch(step))
    logged = [json.loads(line) for line in open(tmp_path / "variant" / "replayed.jsonl")]
    assert logged == [{"step": s, "sha256": manifest["sha256"][str(s)]} for s in range(3)]
    assert not replay.has(3)
    with pytest.raises(FileNotFoundError, match=r"set trainer.max_steps <= 3"):
        replay.receive(3, timeout=0)


def test_a_changed_batch_file_is_refused(tmp_path):
    folder = recorded_run(tmp_path)
    data = bytearray(batch_file(folder, 1).read_bytes())
    data[-1] ^= 1
    batch_file(folder, 1).write_bytes(bytes(data))
    replay = RecordedRollouts(str(folder))
    replay.setup(tmp_path)
    with pytest.raises(BatchFormatError, match="changed since it was recorded"):
        replay.receive(1, timeout=0)


def test_replay_sends_nothing_and_needs_a_recorded_folder(tmp_path):
    with pytest.raises(ValueError, match="needs init_args.path"):
        RecordedRollouts().setup(tmp_path)
    with pytest.raises(FileNotFoundError, match="grpokit rollouts record"):
        RecordedRollouts(str(tmp_path / "nothing")).setup(tmp_path)
    replay = RecordedRollouts(str(recorded_run(tmp_path)))
    replay.setup(tmp_path)
    with pytest.raises(RuntimeError, match="grpokit rollouts replay"):
        replay.send(make_training_batch(0))


def test_export_needs_every_batch(tmp_path):
    run = tmp_path / "run"
    sender = FilesystemTransport()
    sender.setup(run)
    sender.send(make_training_batch(0))
    with pytest.raises(FileNotFoundError, match="keep_last: 0"):
        export(run, tmp_path / "recorded", 2)
