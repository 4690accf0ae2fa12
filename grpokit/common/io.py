"""Atomic file writes: a reader sees the old file or the whole new one, never half of it."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to a temp file beside `path`, fsync it, then rename it over `path`.

    On failure (a full disk, say) the temp file is removed and `path` keeps its previous content; an
    OSError names `path`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise OSError(e.errno, f"cannot write {path} ({e.strerror}); its previous content, if any, is unchanged") from e
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | os.PathLike, obj: object) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True))


def atomic_save_tensors(
    path: str | os.PathLike, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None
) -> None:
    """Save tensors as safetensors (no pickle) atomically."""
    contiguous = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    atomic_write_bytes(path, save(contiguous, metadata=metadata))
