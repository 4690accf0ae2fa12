"""TrainingBatch <-> bytes, as safetensors with a JSON header: no pickle, a version, a size limit."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import load, save

from grpokit.common.errors import RunDataError
from grpokit.types import MicroBatch, PrefixTree, TrainingBatch

FORMAT = "grpokit.TrainingBatch"
VERSION = 2  # 2: a micro-batch's prefix tree travels with it (1: no tree; grpokit before 2026-11-25)
MICRO_BATCH_FIELDS = [f.name for f in fields(MicroBatch) if f.init and f.name != "prefix_tree"]  # the tensors
TREE_FIELDS = [f.name for f in fields(PrefixTree) if not f.name.startswith("_")]


class BatchFormatError(RunDataError):
    """The bytes are not a TrainingBatch this version of grpokit can read."""


def encode_batch(batch: TrainingBatch) -> bytes:
    tensors = {
        f"{i}.{name}": getattr(mb, name).contiguous()
        for i, mb in enumerate(batch.micro_batches)
        for name in MICRO_BATCH_FIELDS
    }
    for i, mb in enumerate(batch.micro_batches):
        if mb.prefix_tree is not None:
            tensors.update({f"{i}.prefix_tree.{name}": getattr(mb.prefix_tree, name) for name in TREE_FIELDS})
    header = {
        "format": FORMAT,
        "version": str(VERSION),
        "step": str(batch.step),
        "temperature": repr(batch.temperature),
        "num_micro_batches": str(len(batch.micro_batches)),
        "metrics": json.dumps(batch.metrics),
    }
    return save(tensors, metadata=header)


def decode_batch(data: bytes, max_bytes: int = 1 << 30) -> TrainingBatch:
    """Parse bytes from `encode_batch`; raises BatchFormatError on anything else."""
    if len(data) > max_bytes:
        raise BatchFormatError(f"batch of {len(data)} bytes exceeds the limit of {max_bytes} bytes")
    header = _read_header(data)
    if header.get("format") == FORMAT and header.get("version") == "1":
        raise BatchFormatError(
            f"this batch is {FORMAT} version 1, written by grpokit before 2026-11-25; this grpokit reads version "
            f"{VERSION}. Write it again with this grpokit: delete a run's rollouts/step_N.safetensors from the "
            "step you resume at (the orchestrator samples them again), or record the rollouts again"
        )
    if header.get("format") != FORMAT or header.get("version") != str(VERSION):
        raise BatchFormatError(
            f"expected {FORMAT} version {VERSION}, got {header.get('format')!r} version {header.get('version')!r}"
        )
    try:
        tensors = load(data)
        n = int(header["num_micro_batches"])
        micro_batches = [_micro_batch(tensors, i) for i in range(n)]
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
    except BatchFormatError as e:
        raise BatchFormatError(f"batch file {path}: {e}; {fix}") from e


def _micro_batch(tensors: dict, i: int) -> MicroBatch:
    tree = None
    if f"{i}.prefix_tree.{TREE_FIELDS[0]}" in tensors:
        tree = PrefixTree(**{name: tensors[f"{i}.prefix_tree.{name}"] for name in TREE_FIELDS})
    return MicroBatch(**{name: tensors[f"{i}.{name}"] for name in MICRO_BATCH_FIELDS}, prefix_tree=tree)


def _read_header(data: bytes) -> dict[str, str]:
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
    return header.get("__metadata__", {})
