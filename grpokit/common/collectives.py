"""Collectives over the trainer's process group, as bytes: this process's rank, rank 0's bytes on every
rank, a JSON object from every rank.

Shared by the trainer (grpokit.trainer.distributed: each rank's share of a step, the step's metrics)
and the trainer's batch stream, which lives in the orchestrator's data module (rank 0 reads the
transport and sends the batch on, grpokit.transport.share_batch). Plain torch.distributed: gloo on the
CPU, NCCL on CUDA.
"""

from __future__ import annotations

import json

import torch
import torch.distributed as dist


def rank_and_world() -> tuple[int, int]:
    """(this process's rank, number of trainer processes); (0, 1) outside a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def collective_device() -> torch.device:
    """Where collective buffers live: the current CUDA device under NCCL, else the CPU (gloo)."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def broadcast_bytes(data: bytes | None) -> bytes:
    """Rank 0's `data` on every rank (the others pass None)."""
    device, root = collective_device(), dist.get_rank() == 0
    length = torch.tensor([len(data) if root else 0], dtype=torch.int64, device=device)
    dist.broadcast(length, src=0)
    if root:
        buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    else:
        buffer = torch.empty(int(length.item()), dtype=torch.uint8, device=device)
    dist.broadcast(buffer, src=0)
    return data if root else buffer.cpu().numpy().tobytes()


def all_gather_json(obj) -> list:
    """`obj` (JSON-serialisable) from every rank, in rank order."""
    device, world = collective_device(), dist.get_world_size()
    raw = json.dumps(obj).encode()
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([len(raw)], dtype=torch.int64, device=device))
    longest = max(int(s.item()) for s in sizes)
    mine = torch.zeros(longest, dtype=torch.uint8, device=device)
    mine[: len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(device)
    buffers = [torch.empty(longest, dtype=torch.uint8, device=device) for _ in range(world)]
    dist.all_gather(buffers, mine)
    return [json.loads(b[: int(s.item())].cpu().numpy().tobytes()) for b, s in zip(buffers, sizes)]
