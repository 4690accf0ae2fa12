"""Batch content checksums (grpokit.transport.codec): a batch damaged after it was written is refused
naming the file (or ZMQ message) and the step, never trained; a batch written before checksums
(version 2) is read with one warning."""

import json
import logging
import re
import threading

import pytest
from safetensors.torch import load, save

from grpokit.testing import free_port
from grpokit.transport import codec
from grpokit.transport.codec import BatchChecksumError, BatchFormatError, decode_batch, encode_batch
from grpokit.transport.zmq import ZMQTransport
from tests.support import assert_same_batch, make_training_batch
from tests.transport.test_batch_files import trainer_stream


def flipped_near_end(data: bytes, count: int = 1000) -> bytes:
    """`data` with its last `count` bytes (at most half of it) inverted: damage the layout survives."""
    count = min(count, len(data) // 2)
    return data[:-count] + bytes(b ^ 0xFF for b in data[-count:])


def metadata_of(data: bytes) -> dict:
    return json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])["__metadata__"]


def test_a_batch_carries_a_checksum_and_round_trips():
    batch = make_training_batch(3, tokens=32)
    data = encode_batch(batch)
    assert metadata_of(data)["checksum"].startswith("crc32:") and metadata_of(data)["version"] == "3"
    assert int.from_bytes(data[:8], "little") % 8 == 0  # the tensor bytes stay 8-byte aligned
    assert_same_batch(decode_batch(data), batch)


def test_a_batch_file_with_bytes_flipped_near_its_end_is_refused_naming_it_and_the_step(tmp_path):
    # before: it decoded and trained (loss -2.7e-26, grad norm 0, kl inf)
    data, stream = trainer_stream(tmp_path, start_step=4, max_steps=5)
    data.transport.send(make_training_batch(4, tokens=400))
    path = tmp_path / "rollouts" / "step_4.safetensors"
    path.write_bytes(flipped_near_end(path.read_bytes()))
    with pytest.raises(
        BatchChecksumError,
        match=rf"batch file {re.escape(str(path))}: the batch of step 4 is damaged: its content's checksum is "
        r"crc32:\w+, its header says crc32:\w+ .*not trained; delete it and resume the run: the orchestrator "
        r"samples step 4 again",
    ):
        next(stream)


def test_a_changed_header_value_is_refused():
    """The checksum covers the header too: a temperature or metric changed in place is damage as well."""
    data = encode_batch(make_training_batch(2))
    damaged = data.replace(b'"temperature":"0.7"', b'"temperature":"0.9"')
    assert damaged != data
    with pytest.raises(BatchChecksumError, match="the batch of step 2 is damaged"):
        decode_batch(damaged)


def test_a_batch_without_a_valid_checksum_in_version_3_is_refused():
    data = encode_batch(make_training_batch(1))
    stripped = save(load(data), metadata={**metadata_of(data), "checksum": "none"})
    with pytest.raises(BatchChecksumError, match=r"step 1 is damaged: its header holds no valid checksum \('none'\)"):
        decode_batch(stripped)


def test_a_version_2_batch_is_read_unchecked_with_one_warning(caplog, monkeypatch):
    monkeypatch.setattr(codec, "_warned_unchecked", False)
    data = encode_batch(make_training_batch(5))
    metadata = {k: v for k, v in metadata_of(data).items() if k != "checksum"}
    old = save(load(data), metadata={**metadata, "version": "2"})
    with caplog.at_level(logging.WARNING, logger="grpokit.transport.codec"):
        assert_same_batch(decode_batch(old), make_training_batch(5))
        decode_batch(old)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "version 2 (step 5)" in warnings[0] and "carry no checksum" in warnings[0]


def test_a_batch_cut_short_still_reads_as_truncated_not_as_damaged():
    data = encode_batch(make_training_batch(0))
    with pytest.raises(BatchFormatError, match="malformed TrainingBatch") as e:
        decode_batch(data[: len(data) - 100])
    assert not isinstance(e.value, BatchChecksumError)


def test_a_damaged_zmq_message_for_the_awaited_step_stops_the_receiver_naming_the_step():
    port = free_port()
    receiver, sender = ZMQTransport(port=port), ZMQTransport(port=port)
    try:
        import zmq

        push = zmq.Context.instance().socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.connect(receiver.address)
        push.send(flipped_near_end(encode_batch(make_training_batch(0)), 50))  # an older step: rejected, logged
        push.send(flipped_near_end(encode_batch(make_training_batch(1)), 50))
        with pytest.raises(
            BatchChecksumError,
            match=r"ZMQTransport on tcp://.*: a \d+-byte message holding the batch of step 1 is "
            r"damaged.*resume the run so that it samples step 1 again",
        ):
            receiver.receive(1, timeout=10)
        assert receiver.rejected == 1
        push.close()
    finally:
        sender.close()
        receiver.close()


def test_zmq_batches_round_trip_with_their_checksums():
    t = ZMQTransport(port=free_port(), hwm=2)
    batches = [make_training_batch(s, tokens=500) for s in range(3)]
    thread = threading.Thread(target=lambda: [t.send(b) for b in batches])
    thread.start()
    for s in range(3):
        assert_same_batch(t.receive(s, timeout=30), batches[s])
    thread.join(timeout=30)
    t.close()
