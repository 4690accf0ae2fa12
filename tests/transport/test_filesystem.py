"""Filesystem transport: round trip, and a reader racing a writer never sees a partial batch."""

import threading

import pytest

from grpokit.transport.codec import BatchFormatError, decode_batch, encode_batch
from grpokit.transport.filesystem import FilesystemTransport
from tests.support import assert_same_batch, make_training_batch

make_batch, assert_same = make_training_batch, assert_same_batch


def test_codec_round_trip_and_rejects_garbage():
    batch = make_batch(3)
    assert_same(decode_batch(encode_batch(batch)), batch)
    data = encode_batch(batch)
    with pytest.raises(BatchFormatError, match="truncated"):
        decode_batch(data[:5])
    with pytest.raises(BatchFormatError):
        decode_batch(data[: len(data) // 2])
    with pytest.raises(BatchFormatError, match="exceeds"):
        decode_batch(data, max_bytes=10)


def test_receive_times_out_with_a_clear_message(tmp_path):
    t = FilesystemTransport()
    t.setup(tmp_path)
    with pytest.raises(TimeoutError, match="no batch for step 0"):
        t.receive(0, timeout=0.1)


def test_reader_racing_writer_sees_only_whole_batches(tmp_path):
    writer, reader = FilesystemTransport(), FilesystemTransport(poll_interval=0.001, keep_last=0)
    writer.setup(tmp_path)
    reader.setup(tmp_path)
    steps = 30
    batches = [make_batch(s, tokens=20_000) for s in range(steps)]  # ~0.5 MB each: writes take a while

    def write_all():
        for b in batches:
            writer.send(b)

    thread = threading.Thread(target=write_all)
    thread.start()
    for s in range(steps):
        assert_same(reader.receive(s, timeout=30), batches[s])  # decode fails loudly on any partial file
    thread.join()
    assert not list((tmp_path / "rollouts").glob("*.tmp"))


def test_read_batches_from_the_newest_checkpoint_on_are_kept_for_a_resumed_trainer(tmp_path):
    t = FilesystemTransport(keep_last=1)
    t.setup(tmp_path)
    for s in range(3):
        t.send(make_batch(s, tokens=8))
        t.receive(s, timeout=1)
    assert [t.has(s) for s in range(3)] == [False, False, True]  # keep_last 1: only the newest read batch
    t.retain_from(3)  # a checkpoint of step 3: a resumed trainer asks for 3, 4, ... again
    for s in range(3, 7):
        t.send(make_batch(s, tokens=8))
        t.receive(s, timeout=1)
    assert [t.has(s) for s in range(7)] == [False] * 3 + [True] * 4
    t.retain_from(6)  # the next checkpoint frees what the previous one held
    t.send(make_batch(7, tokens=8))
    t.receive(7, timeout=1)
    assert [t.has(s) for s in range(8)] == [False] * 6 + [True] * 2
