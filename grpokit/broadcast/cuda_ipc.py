"""CUDA IPC handles as JSON: share a GPU tensor with another process on the same host without pickle.

torch.multiprocessing shares a CUDA tensor by `reduce_tensor`, which returns the function that rebuilds
it (`rebuild_cuda_tensor`) and its arguments: the storage's cudaIpcMemHandle, sizes, strides, dtype,
and the reference-counter and event handles torch uses to keep the producer's memory alive while
consumers hold it. Normally those arguments travel pickled; grpokit writes them as JSON (bytes as
base64, types by name from a fixed list) and the reader calls the one known rebuild function, so no
received data is ever unpickled. The producer must keep the tensor alive until readers are done
(IPCBroadcast keeps `keep_last` steps).
"""

from __future__ import annotations

import base64

import torch
from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

_TYPES = {t.__name__: t for t in (torch.Tensor, torch.nn.Parameter, torch.UntypedStorage, torch.TypedStorage)}


def _encode(value):
    if isinstance(value, bytes):
        return {"bytes": base64.b64encode(value).decode()}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, type):
        if value.__name__ not in _TYPES:
            raise TypeError(f"cannot share a CUDA tensor built from type {value!r}")
        return {"type": value.__name__}
    if isinstance(value, torch.Size):
        return {"size": list(value)}
    if isinstance(value, (tuple, list)):
        return {"tuple": [_encode(v) for v in value]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"cannot encode CUDA IPC argument of type {type(value).__name__}")


def _decode(value):
    if not isinstance(value, dict):
        return value
    ((kind, payload),) = value.items()
    if kind == "bytes":
        return base64.b64decode(payload)
    if kind == "dtype":
        dtype = getattr(torch, payload, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown dtype {payload!r} in a CUDA IPC handle")
        return dtype
    if kind == "type":
        return _TYPES[payload]
    if kind == "size":
        return torch.Size(payload)
    if kind == "tuple":
        return tuple(_decode(v) for v in payload)
    raise ValueError(f"unknown field {kind!r} in a CUDA IPC handle")


def share(tensor: torch.Tensor) -> dict:
    """A JSON-safe description of `tensor`'s CUDA IPC handle."""
    if not tensor.is_cuda:
        raise ValueError("CUDA IPC shares CUDA tensors only")
    rebuild, args = reduce_tensor(tensor)
    if rebuild is not rebuild_cuda_tensor:
        raise TypeError(f"torch shared this tensor with {rebuild.__name__}, not rebuild_cuda_tensor")
    return {"args": _encode(args)}


def open_shared(handle: dict) -> torch.Tensor:
    """The tensor `handle` describes, mapped into this process (no copy)."""
    return rebuild_cuda_tensor(*_decode(handle["args"]))
