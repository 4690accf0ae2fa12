"""TrainingBatch <-> bytes, as safetensors with a JSON header: no pickle, a version, a size limit, and a
checksum of the content.

The checksum (`checksum` in the header's metadata: grpokit.common.checksums.bytes_checksum) covers the
tensor bytes and the rest of the header (tensor names, dtypes, shapes, offsets, step, temperature,
metrics). It is checked once the safetensors layout parses (bytes cut short still read as truncated)
and before any tensor is used: a file or message damaged after it was written (a disk, a copy: bytes
flipped near its end decoded fine and trained a step with loss -2.7e-26 and grad norm 0) is a
BatchChecksumError naming the step, never trained. CRC-32, not sha256: 2.4x faster, and it guards
against damage, not tampering (grpokit.common.checksums). Cost: docs/reliability.md, "Damaged files".

A micro-batch with images (MicroBatch.vision) adds its VisionInputs' tensors as `{i}.vision.{name}` and
their header as the metadata entry `{i}.vision` (JSON), all under the checksum; such a batch is written
as version 4, so a grpokit that would drop the images refuses it. Batches without images stay version 3.
"""

from __future__ import annotations

import json
import logging
from dataclasses import fields
from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import load, save

from grpokit.common.checksums import bytes_checksum, known_checksum
from grpokit.common.errors import RunDataError
from grpokit.types import MicroBatch, PrefixTree, TrainingBatch
from grpokit.vision.inputs import VisionInputs

log = logging.getLogger(__name__)
FORMAT = "grpokit.TrainingBatch"
VERSION = 3  # 3: a checksum of the content (2: without, before 2026-11-29; 1: no prefix tree, before 2026-11-25)
VISION_VERSION = 4  # 3 plus micro-batches' image inputs (written only by batches that have them)
READ_VERSIONS = ("2", str(VERSION), str(VISION_VERSION))
CHECKSUM = "checksum"  # the metadata key
_warned_unchecked = False  # a version 2 batch was read: warned once per process
MICRO_BATCH_FIELDS = [f.name for f in fields(MicroBatch) if f.init and f.name not in ("prefix_tree", "vision")]
TREE_FIELDS = [f.name for f in fields(PrefixTree) if not f.name.startswith("_")]


class BatchFormatError(RunDataError):
    """The bytes are not a TrainingBatch this version of grpokit can read."""


class BatchChecksumError(BatchFormatError):
    """A TrainingBatch whose content does not match its checksum: damaged after it was written.
    `step` is the step its header names (None when unreadable)."""

    def __init__(self, message: str, step: int | None) -> None:
        super().__init__(message)
        self.step = step


def encode_batch(batch: TrainingBatch) -> bytes:
    tensors = {
        f"{i}.{name}": getattr(mb, name).contiguous()
        for i, mb in enumerate(batch.micro_batches)
        for name in MICRO_BATCH_FIELDS
    }
    vision_headers = {}
    for i, mb in enumerate(batch.micro_batches):
        if mb.prefix_tree is not None:
            tensors.update({f"{i}.prefix_tree.{name}": getattr(mb.prefix_tree, name) for name in TREE_FIELDS})
        if mb.vision:
            images, vision_header = mb.vision.to_tensors(prefix=f"{i}.vision.")
            tensors.update(images)
            vision_headers[f"{i}.vision"] = json.dumps(vision_header, sort_keys=True)
    header = {
        "format": FORMAT,
        "version": str(VISION_VERSION if vision_headers else VERSION),
        "step": str(batch.step),
        "temperature": repr(batch.temperature),
        "num_micro_batches": str(len(batch.micro_batches)),
        "metrics": json.dumps(batch.metrics),
        **vision_headers,
    }
    return _with_checksum(save(tensors, metadata=header))


def _with_checksum(data: bytes) -> bytes:
    """safetensors bytes with the checksum of their content added to the header's metadata; the header
    stays padded to 8 bytes (safetensors aligns the tensor bytes so)."""
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    body = memoryview(data)[8 + n :]
    header["__metadata__"][CHECKSUM] = _checksum(header, body)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw + body


def _checksum(header: dict, body: memoryview) -> str:
    """The checksum of a batch: its header without the checksum (canonical JSON), then its tensor bytes."""
    metadata = {k: v for k, v in header.get("__metadata__", {}).items() if k != CHECKSUM}
    canonical = json.dumps({**header, "__metadata__": metadata}, sort_keys=True, separators=(",", ":"))
    return bytes_checksum(canonical.encode(), body)


def decode_batch(data: bytes, max_bytes: int = 1 << 30) -> TrainingBatch:
    """Parse bytes from `encode_batch`; raises BatchFormatError on anything else."""
    if len(data) > max_bytes:
        raise BatchFormatError(f"batch of {len(data)} bytes exceeds the limit of {max_bytes} bytes")
    full = _read_header(data)
    header = full.get("__metadata__", {})
    if header.get("format") == FORMAT and header.get("version") == "1":
        raise BatchFormatError(
            f"this batch is {FORMAT} version 1, written by grpokit before 2026-11-25; this grpokit reads version "
            f"{VERSION}. Write it again with this grpokit: delete a run's rollouts/step_N.safetensors from the "
            "step you resume at (the orchestrator samples them again), or record the rollouts again"
        )
    if header.get("format") != FORMAT or header.get("version") not in READ_VERSIONS:
        raise BatchFormatError(
            f"expected {FORMAT} version {VERSION}, got {header.get('format')!r} version {header.get('version')!r}"
        )
    try:
        tensors = load(data)  # the layout first: bytes cut short read as malformed, as before checksums
    except SafetensorError as e:
        raise BatchFormatError(f"malformed TrainingBatch: {e}") from e
    if header["version"] == "2":
        _warn_unchecked(header)
    else:  # before any tensor is looked at: a damaged batch's counts or trees could fail in any way
        _verify(full, memoryview(data)[8 + int.from_bytes(data[:8], "little") :])
    try:
        n = int(header["num_micro_batches"])
        micro_batches = [_micro_batch(tensors, i, header) for i in range(n)]
        return TrainingBatch(
            step=int(header["step"]),
            micro_batches=micro_batches,
            temperature=float(header["temperature"]),
            metrics={k: float(v) for k, v in json.loads(header["metrics"]).items()},
        )
    except (KeyError, ValueError, TypeError, SafetensorError) as e:
        raise BatchFormatError(f"malformed TrainingBatch: {e}") from e


def decode_batch_file(path: Path, data: bytes, fix: str) -> TrainingBatch:
    """decode_batch of the bytes read from `path`; a BatchFormatError names the file and `fix`."""
    try:
        return decode_batch(data)
    except BatchChecksumError as e:
        raise BatchChecksumError(f"batch file {path}: {e}; {fix}", e.step) from e
    except BatchFormatError as e:
        raise BatchFormatError(f"batch file {path}: {e}; {fix}") from e


def _verify(header: dict, body: memoryview) -> None:
    """Raise BatchChecksumError unless the batch's content matches the checksum in its header."""
    metadata = header.get("__metadata__", {})
    stored, step = metadata.get(CHECKSUM), metadata.get("step")
    step = int(step) if isinstance(step, str) and step.isdigit() else None
    named = f"the batch of step {step}" if step is not None else "a batch (step unreadable)"
    if not known_checksum(stored):
        raise BatchChecksumError(f"{named} is damaged: its header holds no valid checksum ({stored!r})", step)
    actual = _checksum(header, body)
    if actual != stored:
        raise BatchChecksumError(
            f"{named} is damaged: its content's checksum is {actual}, its header says {stored} (bytes changed "
            "after it was written: a disk, a copy); not trained",
            step,
        )


def _warn_unchecked(header: dict) -> None:
    """Version 2 (grpokit before 2026-11-29) has no checksum: read, unchecked, with one warning per process.
    Accepted rather than refused: a run resumed across the upgrade reads the few batch files its orchestrator
    wrote before (refusing them would stop the resume for files that were fine, written atomically and
    read whole), and recorded rollouts are checked against their manifest's sha256 (recorded.py)."""
    global _warned_unchecked
    if not _warned_unchecked:
        _warned_unchecked = True
        log.warning(
            "reading batches of %s version 2 (step %s), written by grpokit before 2026-11-29: they carry no "
            "checksum, so damage to their content goes unnoticed; delete them (the orchestrator samples those "
            "steps again) or record the rollouts again to have them checked",
            FORMAT,
            header.get("step"),
        )


def _micro_batch(tensors: dict, i: int, header: dict) -> MicroBatch:
    tree = vision = None
    if f"{i}.prefix_tree.{TREE_FIELDS[0]}" in tensors:
        tree = PrefixTree(**{name: tensors[f"{i}.prefix_tree.{name}"] for name in TREE_FIELDS})
    if f"{i}.vision" in header:
        vision = VisionInputs.from_tensors(tensors, json.loads(header[f"{i}.vision"]), prefix=f"{i}.vision.")
    fields_ = {name: tensors[f"{i}.{name}"] for name in MICRO_BATCH_FIELDS}
    return MicroBatch(**fields_, prefix_tree=tree, vision=vision)


def _read_header(data: bytes) -> dict:
    """The safetensors header (tensor entries and `__metadata__`)."""
    if len(data) < 8:
        raise BatchFormatError("truncated batch: no safetensors header")
    n = int.from_bytes(data[:8], "little")
    if n > len(data) - 8:
        raise BatchFormatError("truncated batch: header runs past the end")
    try:
        header = json.loads(data[8 : 8 + n])
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BatchFormatError(f"malformed batch header: {e}") from e
    if not isinstance(header, dict) or not isinstance(header.get("__metadata__", {}), dict):
        raise BatchFormatError("malformed batch header: not a JSON object with a __metadata__ object")
    return header
