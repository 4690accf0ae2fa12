"""The JSON form of CUDA IPC handles: exact round trip, and nothing outside the fixed type list decodes.

The CUDA path itself needs a GPU (bench/gpu_check_ipc.py); this checks the no-pickle encoding on CPU.
"""

from __future__ import annotations

import json

import pytest
import torch

from grpokit.broadcast.cuda_ipc import _decode, _encode, share


def test_rebuild_arguments_round_trip_through_json():
    args = (
        torch.Tensor,
        torch.Size([2, 3]),
        (3, 1),
        0,
        torch.UntypedStorage,
        torch.bfloat16,
        0,
        b"\x00\xffhandle",
        12,
        0,
        False,
        b"ref",
        3,
        b"",
        True,
    )
    assert _decode(json.loads(json.dumps(_encode(args)))) == args


def test_unknown_types_and_fields_are_refused():
    with pytest.raises(TypeError, match="cannot share"):
        _encode(dict)
    with pytest.raises(KeyError):
        _decode({"type": "Popen"})
    with pytest.raises(ValueError, match="unknown field"):
        _decode({"pickle": "gASV"})
    with pytest.raises(ValueError, match="unknown dtype"):
        _decode({"dtype": "manual_seed"})


def test_cpu_tensors_are_not_shared_this_way():
    with pytest.raises(ValueError, match="CUDA tensors only"):
        share(torch.zeros(2))
