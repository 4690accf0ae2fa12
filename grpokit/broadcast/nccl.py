"""NCCL weight broadcast: the trainer (rank 0) broadcasts each update to the engine (rank 1) over a
private 2-rank torch.distributed process group; nothing touches the disk.

The group is built directly from a `TCPStore` and a `ProcessGroupNCCL` / `ProcessGroupGloo` backend
object, never with `init_process_group`, so it neither needs nor disturbs the default group that
Lightning's DDP strategy creates. With several trainer ranks, only the one that calls `publish` joins.

Wire protocol, per update (every message is a `broadcast` from rank 0; no pickle anywhere):
1. the header length as one int64 (0 means "the trainer closed"),
2. the header: UTF-8 JSON as a uint8 tensor, `{"version", "step", "lora_config", "bucket_bytes",
   "tensors": [{"name", "dtype", "shape"}, ...], "fingerprints"}` (QeRL's noisy norm weights are tensors
   named under WeightUpdate's NORMS_PREFIX; fingerprints: grpokit.common.checksums.wire_fingerprints of
   the tensors sent, which the engine recomputes on what it received: a mismatch stops the receiver,
   naming the step),
3. the tensors' raw bytes, concatenated in header order with no padding, cut into buckets of at most
   `bucket_bytes`, one broadcast per bucket (a tensor larger than a bucket spans several).
A header the engine cannot validate stops the receiver (the byte stream can no longer be framed) and
the next `poll` raises, rather than serve stale weights quietly.

Departures from the WeightBroadcast contract and things to know:
- `poll` never blocks: a daemon thread on the engine joins the group, receives, and keeps each complete
  update; `poll(after_step, upto)` hands out the newest in (after_step, upto] and forgets every step
  <= after_step (the engine holds a newer one). Steps between the engine's and the newest stay until
  the engine passes them, so the deterministic schedule (upto) can load an older step than the newest;
  polled without `upto`, only the newest is loaded and the rest is forgotten at the next poll.
- The first `publish` blocks until the engine has called `poll` once (it joins the group then), for
  at most `timeout` seconds. Each `publish` returns once all buckets have been broadcast.
- backend "nccl" needs a CUDA device on both ends and a different GPU per rank (NCCL rejects two
  ranks on one GPU); buffers live on `cuda:current_device()` of the caller, and the engine receives
  its tensors there. backend "gloo" runs on CPU (tests, or CPU engines).
- Peers are not authenticated: whoever reaches `host:port` first can join as the engine. `host` is
  therefore 127.0.0.1 by default, and the trainer's TCPStore listens on that address only (a socket
  bound here and handed to TCPStore; on its own TCPStore listens on every interface); gloo binds its
  pairs to `host` too when it is loopback. Across machines set it to the trainer's address on a trusted
  network. No shared token: any client of a TCPStore reads every key, and gloo's and NCCL's own
  connections carry no credentials, so a secret checked through the store would not keep out a process
  that can reach the port; the bound address is what does.
- Exactly one engine: a second process that polls as the engine (a second server, the orchestrator, an
  engine restarted while the trainer runs on) is refused with an error, counted in the trainer's
  TCPStore before it joins, instead of breaking the group the first engine is in. So the orchestrator
  of a RemoteEngine never polls it (`observable = False`); it asks the server for its weight step.
- Received tensors are fresh, separate tensors (copied out of the bucket buffer), so the engine can
  save them with safetensors as they are.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import socket
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

import torch
import torch.distributed as dist

from grpokit.broadcast import WeightBroadcast
from grpokit.common.checksums import fingerprint_mismatches, wire_fingerprints
from grpokit.common.waits import check_seconds
from grpokit.types import WeightUpdate

log = logging.getLogger(__name__)

VERSION = 1
MAX_HEADER_BYTES = 64 << 20  # a header names tensors; 64 MiB is far beyond any real model's
DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
    )
}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = self.dtype.itemsize
        for s in self.shape:
            n *= s
        return n


@dataclass(frozen=True)
class Header:
    step: int
    lora_config: dict | None
    bucket_bytes: int
    specs: list[TensorSpec]
    fingerprints: dict[str, str] | None = None  # grpokit.common.checksums.wire_fingerprints of what was sent

    @property
    def total_bytes(self) -> int:
        return sum(s.nbytes for s in self.specs)


def encode_header(header: Header) -> bytes:
    tensors = [
        {"name": s.name, "dtype": str(s.dtype).removeprefix("torch."), "shape": list(s.shape)} for s in header.specs
    ]
    doc = {
        "version": VERSION,
        "step": header.step,
        "lora_config": header.lora_config,
        "bucket_bytes": header.bucket_bytes,
        "tensors": tensors,
        "fingerprints": header.fingerprints,
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def decode_header(raw: bytes) -> Header:
    """Parse and validate a header; raises ValueError naming the first problem found."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"broadcast header is not UTF-8 JSON: {e}") from e
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        raise ValueError(f"broadcast header must be an object with version {VERSION}")
    step, lora_config, bucket_bytes, tensors = (doc.get(k) for k in ("step", "lora_config", "bucket_bytes", "tensors"))
    if not _is_int(step) or step < 0:
        raise ValueError(f"broadcast header: step must be an int >= 0, got {step!r}")
    if lora_config is not None and not isinstance(lora_config, dict):
        raise ValueError(f"broadcast header: lora_config must be an object or null, got {type(lora_config).__name__}")
    if not _is_int(bucket_bytes) or bucket_bytes <= 0:
        raise ValueError(f"broadcast header: bucket_bytes must be an int > 0, got {bucket_bytes!r}")
    if not isinstance(tensors, list):
        raise ValueError("broadcast header: tensors must be a list")
    specs = [_decode_spec(t) for t in tensors]
    if len({s.name for s in specs}) != len(specs):
        raise ValueError("broadcast header: duplicate tensor names")
    fingerprints = doc.get("fingerprints")
    if fingerprints is not None and not isinstance(fingerprints, dict):
        raise ValueError("broadcast header: fingerprints must be an object or null")
    return Header(step=step, lora_config=lora_config, bucket_bytes=bucket_bytes, specs=specs, fingerprints=fingerprints)


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _decode_spec(t: object) -> TensorSpec:
    if not isinstance(t, dict) or not isinstance(t.get("name"), str):
        raise ValueError(f"broadcast header: bad tensor entry {t!r}")
    if t.get("dtype") not in DTYPES:
        raise ValueError(f"broadcast header: tensor {t['name']!r} has unsupported dtype {t.get('dtype')!r}")
    shape = t.get("shape")
    if not isinstance(shape, list) or not all(_is_int(s) and s >= 0 for s in shape):
        raise ValueError(f"broadcast header: tensor {t['name']!r} has bad shape {shape!r}")
    return TensorSpec(name=t["name"], dtype=DTYPES[t["dtype"]], shape=tuple(shape))


def buckets(total_bytes: int, bucket_bytes: int) -> list[tuple[int, int]]:
    """[start, end) byte ranges of the concatenated tensor bytes, one per broadcast."""
    return [(a, min(a + bucket_bytes, total_bytes)) for a in range(0, total_bytes, bucket_bytes)]


def copy_bucket(flat: list[torch.Tensor], start: int, end: int, bucket: torch.Tensor, into_bucket: bool) -> None:
    """Copy bytes [start, end) of the concatenation of `flat` (uint8 1-D views) to or from `bucket`."""
    offset = 0
    for t in flat:
        lo, hi = max(start, offset), min(end, offset + t.numel())
        if lo < hi:
            part, window = t[lo - offset : hi - offset], bucket[lo - start : hi - start]
            if into_bucket:
                window.copy_(part)
            else:
                part.copy_(window)
        offset += t.numel()
        if offset >= end:
            return


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A 1-D uint8 view of a contiguous tensor's storage bytes."""
    return t.reshape(-1).view(torch.uint8)


class NCCLBroadcast(WeightBroadcast):
    """Trainer -> engine weights over a private 2-rank NCCL (or gloo) group, bucketed, no pickle."""

    observable = False  # polling joins the group as the engine: only the engine's process may poll
    max_engines = 1
    ENGINES_KEY = "grpokit/broadcast/engines"  # counts the processes that joined as the engine

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 29555,
        timeout: float = 600.0,
        backend: Literal["nccl", "gloo"] = "nccl",
        bucket_mb: int = 256,
    ) -> None:
        """
        Args:
            host: the trainer's address; the trainer listens on it (TCPStore) and the engine connects.
            port: TCPStore port on the trainer.
            timeout: seconds to wait for the other side to join, and for any one broadcast.
            backend: "nccl" (CUDA tensors, one GPU per rank) or "gloo" (CPU).
            bucket_mb: the largest single broadcast, in MiB; bounds the staging buffer on each side.
        """
        if backend not in ("nccl", "gloo"):
            raise ValueError(f"broadcast.init_args.backend must be 'nccl' or 'gloo', got {backend!r}")
        if bucket_mb <= 0:
            raise ValueError(f"broadcast.init_args.bucket_mb must be > 0, got {bucket_mb}")
        check_seconds("broadcast.init_args.timeout", timeout)
        self.host, self.port, self.timeout, self.backend = host, port, timeout, backend
        self.bucket_bytes = bucket_mb << 20
        self.rank: int | None = None
        self._pg = self._store = self._device = self._thread = self._error = None
        self._received: dict[int, WeightUpdate] = {}  # complete updates not yet passed by the engine, by step
        self._lock = threading.Lock()
        self._closing = threading.Event()

    # -- both ends ---------------------------------------------------------------------------------

    def _take_role(self, rank: int) -> None:
        if self.rank is not None and self.rank != rank:
            raise RuntimeError("NCCLBroadcast: one instance either publishes (trainer) or polls (engine), not both")
        if self._closing.is_set():
            raise RuntimeError("NCCLBroadcast is closed")
        if self.rank is None:
            self.rank = rank
            self._device = (
                torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else torch.device("cpu")
            )

    def _connect(self) -> None:
        """Join the 2-rank group; blocks until the other side joins, for at most `timeout`."""
        if self._device.type == "cuda":
            torch.cuda.set_device(self._device)  # also in the engine's receiver thread
        timeout = timedelta(seconds=self.timeout)
        fd = self._listen_fd() if self.rank == 0 else None
        store = dist.TCPStore(
            self.host, self.port, world_size=2, is_master=self.rank == 0, timeout=timeout, master_listen_fd=fd
        )
        self._store = store
        if self.rank == 1 and store.add(self.ENGINES_KEY, 1) > 1:
            raise RuntimeError(
                f"NCCLBroadcast at {self.host}:{self.port} already has its engine: it reaches exactly one (a "
                "two-rank group), and this process polled it as a second one. Poll it only in the engine's "
                "process: one `grpokit infer` server (inference.init_args.base_url lists one) and an "
                "orchestrator with `inference: RemoteEngine`; to serve several, use broadcast: "
                "FilesystemBroadcast. An engine restarted while the trainer runs needs the trainer restarted too."
            )
        store = dist.PrefixStore("grpokit/broadcast", store)
        if self.backend == "nccl":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            self._pg = dist.ProcessGroupNCCL(store, self.rank, 2, opts)
        else:
            opts = dist.ProcessGroupGloo._Options()
            opts._timeout = timeout
            opts._devices = [self._gloo_device()]
            self._pg = dist.ProcessGroupGloo(store, self.rank, 2, opts)

    def _listen_fd(self) -> int:
        """The trainer's TCPStore socket, listening on `host` only, handed over as a file descriptor: given a
        host and port alone, TCPStore listens on every interface."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        try:
            sock = socket.create_server((self.host, self.port), family=family, backlog=64)
        except OSError as e:
            raise OSError(
                f"NCCLBroadcast cannot listen on {self.host}:{self.port} (broadcast.init_args.host, "
                f"broadcast.init_args.port): {e}"
            ) from e
        return sock.detach()  # TCPStore owns the descriptor from here and closes it

    def _gloo_device(self):
        try:
            loopback = ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            loopback = self.host == "localhost"
        G = dist.ProcessGroupGloo
        return G.create_device(hostname=self.host) if loopback else G.create_default_device()

    def _broadcast(self, t: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self._pg.broadcast([t], opts).wait()
        if t.is_cuda:  # wait() only orders the current stream after NCCL's; the host must see the bytes too
            torch.cuda.current_stream(t.device).synchronize()

    def close(self) -> None:
        """Tell the engine the trainer is done (trainer), stop receiving (engine), drop the group."""
        if self._closing.is_set():
            return
        self._closing.set()
        if self.rank == 0 and self._pg is not None:
            try:
                self._broadcast(torch.zeros(1, dtype=torch.int64, device=self._device))
            except Exception as e:  # the engine may already be gone
                log.warning("NCCLBroadcast: could not send the close message: %s", e)
        if self._thread is not None:
            self._thread.join(timeout=5.0)  # returns at once if the trainer closed first
            if self._thread.is_alive():
                log.warning("NCCLBroadcast: receiver still waiting on the trainer; left as a daemon thread")
                return  # shutting the group down under a blocked receive can crash the process
        if self._pg is not None and hasattr(self._pg, "shutdown"):
            self._pg.shutdown()
        self._pg = self._store = None

    # -- trainer (rank 0) --------------------------------------------------------------------------

    def publish(self, update: WeightUpdate) -> None:
        self._take_role(0)
        if self._pg is None:
            self._connect()
        wire = update.wire_tensors()
        names = list(wire)
        tensors = [wire[n].detach().contiguous() for n in names]
        specs = [TensorSpec(n, t.dtype, tuple(t.shape)) for n, t in zip(names, tensors)]
        header = Header(
            update.step, update.lora_config, self.bucket_bytes, specs, wire_fingerprints(dict(zip(names, tensors)))
        )
        raw = encode_header(header)
        decode_header(raw)  # fail here, on the trainer, rather than kill the engine's receiver
        self._broadcast(torch.tensor([len(raw)], dtype=torch.int64, device=self._device))
        self._broadcast(torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(self._device))
        flat = [as_bytes(t) for t in tensors]
        staging = torch.empty(min(self.bucket_bytes, header.total_bytes), dtype=torch.uint8, device=self._device)
        for start, end in buckets(header.total_bytes, self.bucket_bytes):
            bucket = staging[: end - start]
            copy_bucket(flat, start, end, bucket, into_bucket=True)
            self._broadcast(bucket)

    # -- engine (rank 1) ---------------------------------------------------------------------------

    def poll(self, after_step: int, upto: int | None = None) -> WeightUpdate | None:
        self._take_role(1)
        if self._thread is None:
            self._thread = threading.Thread(target=self._receive_loop, name="NCCLBroadcast-recv", daemon=True)
            self._thread.start()
        with self._lock:
            if self._error is not None:
                raise RuntimeError(f"NCCLBroadcast receiver stopped: {self._error}") from self._error
            for step in [s for s in self._received if s <= after_step]:
                del self._received[step]
            steps = [s for s in self._received if upto is None or s <= upto]
            return self._received[max(steps)] if steps else None

    @property
    def receiving(self) -> bool:
        """Engine side: the receiver thread runs (False before the first poll, after the trainer closed the
        broadcast, or after an error)."""
        return self._thread is not None and self._thread.is_alive()

    def _receive_loop(self) -> None:
        try:
            self._connect()
            while not self._closing.is_set():
                update = self._receive_one()
                if update is None:
                    log.info("NCCLBroadcast: trainer closed the broadcast")
                    return
                with self._lock:
                    self._received[update.step] = update
        except Exception as e:
            if not self._closing.is_set():
                log.error("NCCLBroadcast receiver stopped: %s", e)
                with self._lock:
                    self._error = e

    def _receive_one(self) -> WeightUpdate | None:
        length = torch.zeros(1, dtype=torch.int64, device=self._device)
        self._broadcast(length)
        n = int(length.item())
        if n == 0:
            return None
        if not 0 < n <= MAX_HEADER_BYTES:
            raise ValueError(f"broadcast header length {n} outside (0, {MAX_HEADER_BYTES}]")
        raw = torch.empty(n, dtype=torch.uint8, device=self._device)
        self._broadcast(raw)
        header = decode_header(raw.cpu().numpy().tobytes())
        tensors = {s.name: torch.empty(s.shape, dtype=s.dtype, device=self._device) for s in header.specs}
        flat = [as_bytes(t) for t in tensors.values()]
        staging = torch.empty(min(header.bucket_bytes, header.total_bytes), dtype=torch.uint8, device=self._device)
        for start, end in buckets(header.total_bytes, header.bucket_bytes):
            bucket = staging[: end - start]
            self._broadcast(bucket)
            copy_bucket(flat, start, end, bucket, into_bucket=False)
        if header.fingerprints is not None and (bad := fingerprint_mismatches(header.fingerprints, tensors)):
            raise ValueError(
                f"step {header.step}: {len(bad)} tensors ({', '.join(bad[:3])}, ...) arrived different from what the "
                "trainer sent (checksums); not loaded. Restart the trainer from its newest checkpoint"
            )
        return WeightUpdate.from_wire(header.step, tensors, lora_config=header.lora_config)
