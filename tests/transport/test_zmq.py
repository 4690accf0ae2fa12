"""ZMQ transport: round trip between threads, backpressure, hostile messages, step order, timeouts."""

import json
import logging
import threading
import time

import pytest
import zmq
from safetensors.torch import load, save

from grpokit.testing import free_port
from grpokit.transport.codec import encode_batch
from grpokit.transport.zmq import ZMQTransport
from tests.support import assert_same_batch, make_training_batch

make_batch, assert_same = make_training_batch, assert_same_batch


@pytest.fixture
def pair():
    """A receiving and a sending transport on a fresh port, as the trainer and orchestrator build them."""
    port = free_port()
    receiver, sender = ZMQTransport(port=port), ZMQTransport(port=port)
    yield receiver, sender
    sender.close()
    receiver.close()


@pytest.fixture
def raw_push():
    """A bare PUSH socket: what a buggy or hostile peer could send."""
    sockets = []

    def connect(port: int):
        sock = zmq.Context.instance().socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(f"tcp://127.0.0.1:{port}")
        sockets.append(sock)
        return sock

    yield connect
    for sock in sockets:
        sock.close()


def with_version(data: bytes, version: str) -> bytes:
    n = int.from_bytes(data[:8], "little")
    metadata = json.loads(data[8 : 8 + n])["__metadata__"]
    return save(load(data), metadata={**metadata, "version": version})


def test_round_trip_between_threads_keeps_order_and_tensors():
    t = ZMQTransport(port=free_port(), hwm=2)  # one object for both ends, as co-locate `fit` uses it
    batches = [make_batch(s, tokens=2_000) for s in range(6)]
    thread = threading.Thread(target=lambda: [t.send(b) for b in batches])
    thread.start()
    for s in range(6):
        assert_same(t.receive(s, timeout=30), batches[s])
    thread.join(timeout=30)
    t.close()
    assert t.rejected == 0


def test_default_host_is_loopback():
    port = free_port()
    t = ZMQTransport(port=port)
    assert t.host == "127.0.0.1" and t.address == f"tcp://127.0.0.1:{port}"
    with pytest.raises(TimeoutError):
        t.receive(0, timeout=0.05)
    bound = t._sockets["receive"][0].getsockopt(zmq.LAST_ENDPOINT).decode()
    t.close()
    assert bound == f"tcp://127.0.0.1:{port}"


def test_full_queue_blocks_send_then_times_out():
    t = ZMQTransport(port=free_port(), hwm=1, send_timeout=0.3, close_timeout=0.1)  # no receiver
    sent = 0
    with pytest.raises(TimeoutError, match=r"step \d.*full \(hwm=1\)"):
        for step in range(10):
            start = time.monotonic()
            t.send(make_batch(step))
            sent += 1
    assert sent <= 2, "the queue grew past the high-water mark"
    assert time.monotonic() - start >= 0.3
    t.close()


def test_a_sender_that_closes_right_after_its_last_send_still_delivers_it():
    """An orchestrator process sends its last batch and exits: close() waits (up to close_timeout) for the
    queued batch to leave instead of dropping it, here for a trainer that binds only afterwards."""
    port = free_port()
    sender, received = ZMQTransport(port=port), []
    receiver_thread = threading.Thread(
        target=lambda: (
            time.sleep(0.5),
            received.append(ZMQTransport(port=port)),
            received.append(received[0].receive(0, timeout=30)),
        )
    )
    receiver_thread.start()
    sender.send(make_batch(0))
    start = time.monotonic()
    sender.close()
    receiver_thread.join(timeout=60)
    received[0].close()
    assert received[1].step == 0, "the batch queued before close() was dropped"
    assert time.monotonic() - start < 30


def test_close_from_another_thread_ends_a_blocked_send():
    t = ZMQTransport(port=free_port(), hwm=1, send_timeout=60)
    errors = []

    def send_forever():
        try:
            for step in range(10):
                t.send(make_batch(step))
        except RuntimeError as e:
            errors.append(e)

    thread = threading.Thread(target=send_forever)
    thread.start()
    time.sleep(0.3)  # the thread is now blocked on the full queue
    t.close()
    thread.join(timeout=5)
    assert not thread.is_alive() and "closed" in str(errors[0])
    assert not t._sockets


def test_bad_messages_are_rejected_and_counted_then_a_valid_batch_arrives(pair, raw_push, caplog):
    receiver, sender = pair
    push, good = raw_push(sender.port), encode_batch(make_batch(0))
    push.send(b"garbage")
    push.send(good[: len(good) // 2])  # truncated
    push.send(with_version(good, "99"))
    push.send(b"\x02\x00\x00\x00\x00\x00\x00\x00[]")  # a header the codec trips over with AttributeError
    push.send(good)  # same connection, so it arrives after the four bad ones
    with caplog.at_level(logging.ERROR, logger="grpokit.transport.zmq"):
        assert_same(receiver.receive(0, timeout=10), make_batch(0))
    assert receiver.rejected == 4
    reasons = " ".join(r.getMessage() for r in caplog.records)
    assert "no safetensors header" in reasons and "malformed TrainingBatch" in reasons and "version '99'" in reasons


def test_oversized_message_is_dropped_and_a_valid_batch_still_arrives(raw_push):
    port = free_port()
    receiver, sender = (
        ZMQTransport(port=port, max_message_bytes=64_000),
        ZMQTransport(port=port, max_message_bytes=64_000),
    )
    with pytest.raises(ValueError, match="over data.transport max_message_bytes"):
        sender.send(make_batch(0, tokens=20_000))  # ~500 kB: refused before it is sent
    raw_push(port).send(b"\0" * 100_000)  # libzmq drops it with its connection, before Python sees it
    sender.send(make_batch(0))
    assert_same(receiver.receive(0, timeout=10), make_batch(0))
    with pytest.raises(TimeoutError):
        receiver.receive(1, timeout=0.3)  # the oversized message never comes out
    sender.close()
    receiver.close()


def test_earlier_steps_are_dropped_and_later_steps_kept(pair, caplog):
    receiver, sender = pair
    for step in (0, 2, 1):  # a resent step 0, then 2 before 1
        sender.send(make_batch(step))
    with caplog.at_level(logging.WARNING, logger="grpokit.transport.zmq"):
        assert_same(receiver.receive(1, timeout=10), make_batch(1))
    assert "dropped the batch for step 0 while waiting for step 1" in caplog.text
    assert_same(receiver.receive(2, timeout=0.01), make_batch(2))  # already held


def test_receive_timeout_names_the_step_the_address_and_later_steps(pair):
    receiver, sender = pair
    with pytest.raises(TimeoutError, match=rf"no batch for step 5 on tcp://127.0.0.1:{sender.port} after 0.2s"):
        receiver.receive(5, timeout=0.2)
    sender.send(make_batch(6))
    with pytest.raises(TimeoutError, match=r"later steps \[6\] did arrive"):
        receiver.receive(5, timeout=1.0)


def test_hwm_zero_is_refused():
    with pytest.raises(ValueError, match="hwm must be >= 1"):
        ZMQTransport(hwm=0)


def test_a_taken_port_gives_an_error_naming_it(pair):
    receiver, _ = pair
    with pytest.raises(TimeoutError):
        receiver.receive(0, timeout=0.01)  # binds the port
    other = ZMQTransport(port=receiver.port)
    with pytest.raises(OSError, match=rf"cannot bind tcp://127.0.0.1:{receiver.port}.*data.transport.init_args.port"):
        other.receive(0, timeout=0.01)
    other.close()
