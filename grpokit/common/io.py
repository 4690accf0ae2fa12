"""Atomic file writes: a reader sees the old file or the whole new one, never half of it.

Every temp-then-rename in grpokit goes through here: bytes, text, JSON and tensors (atomic_write_*),
JSON under a name no other writer holds (atomic_create_json: eval reports), a file that a library writes
to a path (atomic_path: Lightning's checkpoints), and a folder of files (atomic_folder: broadcast steps,
the converted model).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import save


def _write_beside(path: str | os.PathLike, data: bytes, place) -> None:
    """Write `data` to a temp file beside `path`, fsync it, then `place(tmp, path)` (os.replace: over any file
    there; os.link: only where none is). The temp file never outlives the call; an OSError names `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        place(tmp, path)
    except OSError as e:  # OSError(errno, ...) keeps the subclass: FileExistsError stays one
        raise OSError(e.errno, f"cannot write {path} ({e.strerror}); its previous content, if any, is unchanged") from e
    finally:
        Path(tmp).unlink(missing_ok=True)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to a temp file beside `path`, fsync it, then rename it over `path`.

    On failure (a full disk, say) the temp file is removed and `path` keeps its previous content; an
    OSError names `path`.
    """
    _write_beside(path, data, os.replace)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | os.PathLike, obj: object) -> None:
    atomic_write_text(path, _json_text(obj))


def atomic_create_json(path: str | os.PathLike, obj: object) -> bool:
    """Write `obj` as JSON to `path` only if no file is there: True if written, False if `path` exists.

    The temp file is hard-linked to `path`: the link is atomic and fails where a file exists, so of two
    writers racing for one name exactly one wins, and no reader sees a half-written file.
    """
    try:
        _write_beside(path, _json_text(obj).encode(), os.link)
        return True
    except FileExistsError:
        return False


def _json_text(obj: object) -> str:
    return json.dumps(obj, indent=2, sort_keys=True)


def atomic_save_tensors(
    path: str | os.PathLike, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None
) -> None:
    """Save tensors as safetensors (no pickle) atomically."""
    contiguous = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    atomic_write_bytes(path, save(contiguous, metadata=metadata))


@contextmanager
def atomic_path(final: str | os.PathLike, tmp: str | os.PathLike | None = None) -> Iterator[Path]:
    """A temp path beside `final` for a writer that takes a path. When the block ends without error and
    the writer wrote the file (a DDP rank > 0 may write nothing), it is fsynced and renamed over `final`;
    on error it is removed and `final` keeps its previous content."""
    final = Path(final)
    tmp = Path(tmp) if tmp is not None else final.with_name(f".{final.name}.{os.getpid()}.tmp")
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        yield tmp
        if tmp.exists():
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def atomic_folder(
    final: str | os.PathLike, tmp: str | os.PathLike | None = None, keep_existing: bool = False
) -> Iterator[Path]:
    """A fresh temp folder beside `final` to fill. When the block ends without error it becomes `final`
    (an existing `final` is replaced, or, with `keep_existing`, kept and the temp folder dropped: another
    process got there first); on error it is removed, so no half-written folder stays behind."""
    final = Path(final)
    if tmp is None:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp"))
    else:
        tmp = Path(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if keep_existing and final.exists():
        shutil.rmtree(tmp, ignore_errors=True)
        return
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
