"""IPC weight broadcast: the trainer's tensors in named shared memory, mapped by the engine (same host).

Per step the trainer writes all tensors of the update into one POSIX shared-memory segment
(`/dev/shm/grpokit-<run>-<step>`) and then, atomically, a small JSON index beside the run
(`{run_dir}/broadcasts_ipc/step_N.json`: segment name, and each tensor's name, dtype, shape and byte
offset; QeRL's noisy norm weights ride along, named under WeightUpdate's NORMS_PREFIX). The engine
maps the segment and views the tensors without copying them (`torch.frombuffer`); loading them into
its model is the only copy. A LoRA update moves only the adapter. The index is written after the
segment is complete, so a reader never sees a partial step; old segments are unlinked after
`keep_last` newer steps.

CUDA: when the update's tensors are on a GPU, nothing goes through host memory. The trainer clones
them into buffers it keeps for `keep_last` steps and the index carries their CUDA IPC handles (as JSON,
grpokit.broadcast.cuda_ipc; never pickled); an engine in another process maps them, and an engine in the
trainer's own process (co-locate `fit`) takes the same GPU tensors directly. The shared-memory path
above is this path's CPU twin, which is what CI tests; bench/gpu_check_ipc.py checks the CUDA path.

Three processes (`grpokit infer | orchestrate | train`, one host): only the server polls it
(`observable = False`); the orchestrator asks the server for its weight step (GET /v1/weights). The
trainer unlinks its segments when it exits, so a server that had not loaded the last step by then keeps
the step it has.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from multiprocessing import resource_tracker, shared_memory

import torch

from grpokit.broadcast import WeightBroadcast
from grpokit.broadcast.cuda_ipc import open_shared, share
from grpokit.common.checksums import fingerprint_mismatches, wire_fingerprints
from grpokit.common.io import atomic_write_json
from grpokit.types import WeightUpdate

log = logging.getLogger(__name__)
DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.float64,
        torch.int64,
        torch.int32,
        torch.uint8,
        torch.bool,
    )
}


def check_fingerprints(step: int, index: dict, tensors: dict[str, torch.Tensor]) -> None:
    """Refuse a step whose mapped tensors are not what the trainer wrote (its index's fingerprints:
    grpokit.common.checksums.wire_fingerprints), naming the step; an index without them (an older
    grpokit) is read unchecked."""
    expected = index.get("fingerprints")
    if expected is not None and (bad := fingerprint_mismatches(expected, tensors)):
        raise RuntimeError(
            f"IPCBroadcast step {step}: {len(bad)} tensors ({', '.join(bad[:3])}, ...) in shared memory are not "
            "what the trainer wrote (checksums); not loaded. Restart the trainer from its newest checkpoint"
        )


class IPCBroadcast(WeightBroadcast):
    """Weights through named shared memory on one host: written once, mapped by the engine."""

    observable = (
        False  # polling maps the segments (or CUDA buffers): the engine's process only, never the orchestrator's
    )

    def __init__(self, keep_last: int = 3) -> None:
        """
        Args:
            keep_last: newest steps whose segments stay mapped-able (>= 2, so a reader of the previous
                step is never raced by its deletion).
        """
        if keep_last < 2:
            raise ValueError(f"broadcast.init_args.keep_last must be >= 2, got {keep_last}")
        self.keep_last = keep_last
        self._segments: dict[int, shared_memory.SharedMemory] = {}
        self._cuda: dict[int, dict[str, torch.Tensor]] = {}  # step -> GPU buffers readers may have mapped

    @property
    def index_dir(self):
        return self.run_dir / "broadcasts_ipc"

    def segment_name(self, step: int) -> str:
        return f"grpokit-{os.getpid()}-{step}-{secrets.token_hex(4)}"  # unique; readers learn it from the index

    def publish(self, update: WeightUpdate) -> None:
        wire = update.wire_tensors()
        if wire and all(t.is_cuda for t in wire.values()):
            self._publish_cuda(update, wire)
            return
        entries, offset = [], 0
        tensors = {k: v.detach().contiguous().cpu() for k, v in update.wire_tensors().items()}
        for name, t in tensors.items():
            if str(t.dtype).removeprefix("torch.") not in DTYPES:
                raise ValueError(f"IPCBroadcast cannot carry tensor {name!r} of dtype {t.dtype}")
            nbytes = t.numel() * t.element_size()
            entries.append(
                {
                    "name": name,
                    "dtype": str(t.dtype).removeprefix("torch."),
                    "shape": list(t.shape),
                    "offset": offset,
                    "nbytes": nbytes,
                }
            )
            offset += (nbytes + 63) // 64 * 64  # 64-byte aligned views
        segment = shared_memory.SharedMemory(name=self.segment_name(update.step), create=True, size=max(offset, 1))
        for entry, t in zip(entries, tensors.values()):
            if entry["nbytes"]:
                view = torch.frombuffer(segment.buf, dtype=torch.uint8, count=entry["nbytes"], offset=entry["offset"])
                view.copy_(t.reshape(-1).view(torch.uint8))
        self._segments[update.step] = segment
        atomic_write_json(
            self.index_dir / f"step_{update.step}.json",
            {
                "step": update.step,
                "segment": segment.name,
                "tensors": entries,
                "lora_config": update.lora_config,
                "fingerprints": wire_fingerprints(tensors),
            },
        )
        self._prune(update.step)

    def poll(self, after_step: int, upto: int | None = None) -> WeightUpdate | None:
        if not self.index_dir.exists():
            return None
        steps = sorted(int(p.stem[5:]) for p in self.index_dir.glob("step_*.json") if p.stem[5:].isdigit())
        for step in reversed([s for s in steps if upto is None or s <= upto]):
            if step <= after_step:
                return None
            try:
                return self._read(step)
            except FileNotFoundError:
                log.warning("ipc broadcast step %d vanished while reading", step)
        return None

    def _publish_cuda(self, update: WeightUpdate, wire: dict[str, torch.Tensor]) -> None:

        buffers = {k: v.detach().clone() for k, v in wire.items()}  # the trainer's own tensors keep changing
        # the clones are complete before any reader maps them (this stream only: a device-wide sync would
        # break a CUDA graph capture that a co-located engine's thread may be doing meanwhile)
        torch.cuda.current_stream().synchronize()
        self._cuda[update.step] = buffers
        handles = {k: share(v) for k, v in buffers.items()}
        atomic_write_json(
            self.index_dir / f"step_{update.step}.json",
            {
                "step": update.step,
                "cuda": handles,
                "pid": os.getpid(),
                "lora_config": update.lora_config,
                "fingerprints": wire_fingerprints(buffers),
            },
        )
        self._prune(update.step)

    def _read_cuda(self, step: int, index: dict) -> WeightUpdate:

        own = self._cuda.get(step)
        if own is not None and index.get("pid") == os.getpid():
            tensors = own  # co-locate: the same GPU tensors, no copy and no handle
        else:
            tensors = {k: open_shared(h) for k, h in index["cuda"].items()}
            check_fingerprints(step, index, tensors)
        return WeightUpdate.from_wire(step, dict(tensors), lora_config=index["lora_config"])

    def _read(self, step: int) -> WeightUpdate:
        index = json.loads((self.index_dir / f"step_{step}.json").read_text())
        if "cuda" in index:
            return self._read_cuda(step, index)
        own = self._segments.get(step)
        if own is not None and own.name == index["segment"]:
            segment = own  # co-locate: this object published it; view the same mapping
        else:
            segment = shared_memory.SharedMemory(name=index["segment"])
            # the writer owns the segment: stop this process's tracker from unlinking it at exit
            resource_tracker.unregister(segment._name, "shared_memory")
        tensors = {}
        for e in index["tensors"]:
            dtype = DTYPES[e["dtype"]]
            count = e["nbytes"] // torch.empty(0, dtype=dtype).element_size()
            flat = (
                torch.frombuffer(segment.buf, dtype=dtype, count=count, offset=e["offset"])
                if count
                else torch.empty(0, dtype=dtype)
            )
            tensors[e["name"]] = flat.reshape(e["shape"])
        if segment is not own:
            check_fingerprints(step, index, tensors)
        update = WeightUpdate.from_wire(step, tensors, lora_config=index["lora_config"])
        update._segment = segment  # the views need the mapping: closing it under them would fail
        return update

    def _prune(self, newest: int) -> None:
        for step in [s for s in self._cuda if s <= newest - self.keep_last]:
            (self.index_dir / f"step_{step}.json").unlink(missing_ok=True)
            del self._cuda[step]
        for step in [s for s in self._segments if s <= newest - self.keep_last]:
            (self.index_dir / f"step_{step}.json").unlink(missing_ok=True)
            segment = self._segments.pop(step)
            segment.close()
            segment.unlink()

    def close(self) -> None:
        for step in list(self._cuda):
            (self.index_dir / f"step_{step}.json").unlink(missing_ok=True)
        self._cuda.clear()
        for step in list(self._segments):
            (self.index_dir / f"step_{step}.json").unlink(missing_ok=True)
            segment = self._segments.pop(step)
            segment.close()
            segment.unlink()
