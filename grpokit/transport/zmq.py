"""ZMQ transport: the orchestrator PUSHes encoded batches to a PULL socket the trainer binds over TCP.

Each message is one frame holding exactly `encode_batch(batch)` (safetensors with a versioned header):
nothing is ever unpickled, so a bad message can at worst be rejected, never run code. A message whose
content does not match its checksum (codec.py) is never trained: one for the step awaited or a later
one stops the trainer with an error naming the step (that batch will not come again); an older one is
rejected like any malformed message.

Who binds: the trainer binds `host:port` and the orchestrator connects. The trainer is the long-lived
consumer with a fixed address; an orchestrator that restarts simply reconnects, and one that starts first
queues up to `hwm` batches until the trainer is up. The bind address is also the security boundary.

Security: ZMQ does not authenticate peers. Whoever can reach `host:port` can hand the trainer batches
to train on (not code to run). `host` is therefore 127.0.0.1 by default; for an orchestrator on another
machine, set `host` explicitly to the trainer's address on a trusted network (the trainer binds it, the
orchestrator connects to it).

Departures from the Transport contract and the recipe's numbers:
- `send` returns once the batch is queued, not once the trainer holds it. Up to `hwm` batches wait on
  each side (sender and receiver queues) plus what the OS socket buffers hold; then `send` blocks,
  for at most `send_timeout` seconds. `close()` by the sending thread waits up to `close_timeout`
  seconds for queued batches to leave (an orchestrator that exits right after its last `send` would
  otherwise drop that batch: LINGER 0 lost the last step in a three-process run), then drops the rest
  rather than hang; the receiver's socket closes at once.
- A message over `max_message_bytes` is dropped by libzmq (MAXMSGSIZE) together with its connection
  before Python sees it, so it never costs memory but is not counted in `rejected`; the sender refuses
  such a batch with an error instead of sending it.
"""

from __future__ import annotations

import logging
import threading
import time

from grpokit.common.waits import check_seconds
from grpokit.transport import Transport
from grpokit.transport.codec import BatchChecksumError, decode_batch, encode_batch
from grpokit.types import TrainingBatch

log = logging.getLogger(__name__)

POLL_SLICE = 0.05  # seconds: how soon a blocked send or receive notices close() from another thread


def _zmq():
    """pyzmq, imported on first use so that listing components works without it."""
    try:
        import zmq
    except ImportError as e:
        raise ImportError("ZMQTransport needs pyzmq: pip install pyzmq") from e
    return zmq


class ZMQTransport(Transport):
    """Batches over TCP: the orchestrator PUSHes, the trainer PULLs; no pickle, bounded queues."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 5555,
        hwm: int = 4,
        max_message_bytes: int = 1 << 30,
        send_timeout: float = 600.0,
        close_timeout: float = 30.0,
    ) -> None:
        """
        Args:
            host: the trainer's address: the trainer binds it, the orchestrator connects to it. Loopback
                by default; anything else exposes the trainer to every host that can reach it.
            port: TCP port on `host`.
            hwm: high-water mark: batches that may queue on each side before `send` blocks (backpressure).
            max_message_bytes: larger messages are refused by the sender and dropped by the receiver.
            send_timeout: seconds `send` waits for room in a full queue before raising TimeoutError.
            close_timeout: seconds `close` waits for queued batches to reach the trainer before dropping them.
        """
        if hwm < 1:
            raise ValueError(f"data.transport hwm must be >= 1 (ZMQ reads 0 as no limit), got {hwm}")
        check_seconds("data.transport send_timeout", send_timeout)
        check_seconds("data.transport close_timeout", close_timeout)
        self.host, self.port, self.hwm = host, port, hwm
        self.max_message_bytes, self.send_timeout, self.close_timeout = max_message_bytes, send_timeout, close_timeout
        self.rejected = 0  # malformed messages received and discarded
        self._pending: dict[int, TrainingBatch] = {}  # batches that arrived before the step they are for
        self._sockets: dict[str, tuple[object, threading.Thread]] = {}  # role -> (socket, thread using it)
        self._closed = threading.Event()

    @property
    def address(self) -> str:
        return f"tcp://{self.host}:{self.port}"

    # ---- orchestrator side ------------------------------------------------------------------------
    def send(self, batch: TrainingBatch) -> None:
        zmq = _zmq()
        data = encode_batch(batch)
        if len(data) > self.max_message_bytes:
            raise ValueError(
                f"the batch for step {batch.step} is {len(data)} bytes, over data.transport max_message_bytes "
                f"({self.max_message_bytes}): the trainer would drop it. Raise the limit or lower batch_size/seq_len."
            )
        sock, deadline = self._socket("send"), time.monotonic() + self.send_timeout
        while True:
            try:
                sock.send(data, zmq.NOBLOCK, copy=False)
                return
            except zmq.Again:
                pass
            self._raise_if_closed("send")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"could not queue the batch for step {batch.step} within {self.send_timeout:.1f}s: the queue to "
                    f"{self.address} is full (hwm={self.hwm}). Is the trainer running and receiving on that address?"
                )
            sock.poll(POLL_SLICE * 1000, zmq.POLLOUT)

    # ---- trainer side -----------------------------------------------------------------------------
    def receive(self, step: int, timeout: float) -> TrainingBatch:
        zmq = _zmq()
        sock, poller = self._socket("receive"), zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        deadline = time.monotonic() + timeout
        while step not in self._pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(self._timeout_message(step, timeout))
            self._raise_if_closed("receive")
            if poller.poll(min(remaining, POLL_SLICE) * 1000):
                self._accept(sock.recv(zmq.NOBLOCK), step)
        return self._pending.pop(step)

    def _accept(self, data: bytes, step: int) -> None:
        """Decode one message; keep it if it is for `step` or a later step, else log why it is dropped."""
        try:
            batch = decode_batch(data, self.max_message_bytes)
        except BatchChecksumError as e:
            if e.step is not None and e.step >= step:  # that step's batch is lost: waiting on would time out
                raise BatchChecksumError(
                    f"ZMQTransport on {self.address}: a {len(data)}-byte message holding {e}. The orchestrator "
                    f"does not send it again: resume the run so that it samples step {e.step} again",
                    e.step,
                ) from e
            self._reject(data, e)
            return
        except Exception as e:  # bytes from the network: whatever the decoder raises is the sender's fault
            self._reject(data, e)
            return
        if batch.step < step:
            log.warning(
                "dropped the batch for step %d while waiting for step %d: an orchestrator that restarted "
                "from an earlier step re-sends batches the trainer already has",
                batch.step,
                step,
            )
        elif batch.step != step and len(self._pending) >= self.hwm:
            log.error(
                "dropped the batch for step %d: later batches %s already wait for step %d",
                batch.step,
                sorted(self._pending),
                step,
            )
        else:
            self._pending[batch.step] = batch

    def _reject(self, data: bytes, e: Exception) -> None:
        self.rejected += 1
        log.error(
            "ZMQTransport on %s rejected a %d-byte message (%d so far): %s: %s",
            self.address,
            len(data),
            self.rejected,
            type(e).__name__,
            e,
        )

    def _timeout_message(self, step: int, timeout: float) -> str:
        message = (
            f"no batch for step {step} on {self.address} after {timeout:.1f}s: is the orchestrator running, "
            "and does its data.transport name the same host and port?"
        )
        if self._pending:
            message += (
                f" Batches for later steps {sorted(self._pending)} did arrive, so step {step} was lost or never "
                "sent: did the orchestrator start at a later step than the trainer, or send a batch over "
                "max_message_bytes (libzmq drops those)?"
            )
        if self.rejected:
            message += f" {self.rejected} malformed message(s) were rejected; see the log."
        return message

    # ---- sockets ----------------------------------------------------------------------------------
    def _socket(self, role: str):
        """This role's socket, created on first use by the calling thread (so one recipe serves both ends)."""
        self._raise_if_closed(role)
        if role in self._sockets:
            sock = self._sockets[role][0]
        else:
            sock = (self._open_push if role == "send" else self._open_pull)(_zmq())
        self._sockets[role] = (sock, threading.current_thread())  # the thread close() must leave it to
        return sock

    def _open_push(self, zmq):
        sock = zmq.Context.instance().socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, self.hwm)
        sock.connect(self.address)
        return sock

    def _open_pull(self, zmq):
        sock = zmq.Context.instance().socket(zmq.PULL)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, self.hwm)  # the default (1000) would let libzmq buffer 1000 batches
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)  # refused before it is allocated
        try:
            sock.bind(self.address)
        except zmq.ZMQError as e:
            sock.close()
            raise OSError(
                f"the trainer cannot bind {self.address} ({e}): is another "
                "run using this port? Set data.transport.init_args.port."
            ) from e
        return sock

    def _raise_if_closed(self, role: str) -> None:
        if self._closed.is_set():
            if role in self._sockets:  # close() left it to this thread: a socket is not thread-safe
                self._sockets.pop(role)[0].close(linger=0)
            raise RuntimeError(f"ZMQTransport on {self.address} is closed ({role})")

    def close(self) -> None:
        """Close for good. A socket in use by another live thread is closed by that thread on its next poll."""
        self._closed.set()
        for role, (sock, thread) in list(self._sockets.items()):
            if thread is threading.current_thread() or not thread.is_alive():
                sock.close(linger=int(self.close_timeout * 1000) if role == "send" else 0)  # deliver what was sent
                del self._sockets[role]
