"""Check and time NCCLBroadcast between two processes: trainer (rank 0) -> engine (rank 1).

On a machine with 2+ GPUs:   python bench/gpu_check_nccl.py --size-mb 2048 --bucket-mb 256
On CPU (smoke test):         python bench/gpu_check_nccl.py --backend gloo --size-mb 64 --steps 2

Rank r uses cuda:devices[r]. NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), so the nccl
backend needs two devices. Each step, the trainer publishes `size_mb` of weights split into
`num_tensors` tensors; the engine polls, checks every tensor's sha256 against the trainer's (the
bit-identical check) and acknowledges. Reported per step: publish time (trainer side) and publish ->
engine acknowledgement (includes the poll latency, not the checksum); GB/s is 1e9 bytes per second.
The first step is a warm-up (group setup, NCCL communicator) and is shown but left out of the means.
"""

from __future__ import annotations

import argparse
import hashlib
import time

import torch
import torch.multiprocessing as mp

from grpokit.broadcast.nccl import NCCLBroadcast, as_bytes
from grpokit.types import WeightUpdate


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    p.add_argument("--size-mb", type=int, default=1024, help="MiB of weights per update")
    p.add_argument("--num-tensors", type=int, default=64)
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    p.add_argument("--bucket-mb", type=int, default=256)
    p.add_argument("--steps", type=int, default=5, help="updates to send, the first one a warm-up")
    p.add_argument("--port", type=int, default=29555)
    p.add_argument("--devices", default="0,1", help="CUDA device of rank 0 and of rank 1 (nccl only)")
    p.add_argument("--no-verify", action="store_true", help="skip the sha256 check (it runs on the CPU)")
    return p.parse_args(argv)


def sha256s(tensors: dict[str, torch.Tensor]) -> dict[str, str]:
    return {k: hashlib.sha256(as_bytes(t.contiguous().cpu()).numpy().tobytes()).hexdigest() for k, t in tensors.items()}


def make_update(step: int, args: argparse.Namespace, device: torch.device) -> WeightUpdate:
    dtype = getattr(torch, args.dtype)
    numel = (args.size_mb << 20) // dtype.itemsize // args.num_tensors
    g = torch.Generator(device=device).manual_seed(step)
    tensors = {
        f"layers.{i}.weight": torch.randn(numel, generator=g, device=device).to(dtype) for i in range(args.num_tensors)
    }
    return WeightUpdate(step=step, tensors=tensors, lora_config=None)


def device_of(rank: int, args: argparse.Namespace) -> torch.device:
    if args.backend == "gloo":
        return torch.device("cpu")
    device = torch.device("cuda", int(args.devices.split(",")[rank]))
    torch.cuda.set_device(device)
    return device


def trainer(args: argparse.Namespace, queue, acks) -> None:
    device = device_of(0, args)
    b = NCCLBroadcast(port=args.port, backend=args.backend, bucket_mb=args.bucket_mb)
    for step in range(args.steps):
        update = make_update(step, args, device)
        nbytes = sum(t.numel() * t.element_size() for t in update.tensors.values())
        queue.put(("sha", step, None if args.no_verify else sha256s(update.tensors)))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        b.publish(update)
        t_publish = time.perf_counter() - t0
        ok = acks.get(timeout=b.timeout)
        queue.put(("time", step, (nbytes, t_publish, time.perf_counter() - t0, ok)))
    b.close()


def engine(args: argparse.Namespace, queue, acks) -> None:
    device_of(1, args)
    b = NCCLBroadcast(port=args.port, backend=args.backend, bucket_mb=args.bucket_mb)
    last = -1
    while last < args.steps - 1:
        update = b.poll(last)
        if update is None:
            time.sleep(0.0005)
            continue
        acks.put(True)  # before the checksum, so it does not count towards the transfer time
        if update.step != last + 1:
            raise RuntimeError(f"engine got step {update.step} after {last}")
        queue.put(("got", update.step, None if args.no_verify else sha256s(update.tensors)))
        last = update.step
    b.close()


def run(rank: int, args: argparse.Namespace, queue, acks) -> None:
    (trainer if rank == 0 else engine)(args, queue, acks)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.backend == "nccl" and torch.cuda.device_count() < 2:
        raise SystemExit(
            "--backend nccl needs 2 CUDA devices (NCCL rejects two "
            f"ranks on one GPU); found {torch.cuda.device_count()}"
        )
    ctx = mp.get_context("spawn")
    queue, acks = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=run, args=(rank, args, queue, acks)) for rank in range(2)]
    for p in procs:
        p.start()
    sent, got, times = {}, {}, {}
    while len(times) < args.steps or len(got) < args.steps:
        kind, step, value = queue.get(timeout=900)
        {"sha": sent, "got": got, "time": times}[kind][step] = value
    for p in procs:
        p.join()
    print(
        f"backend={args.backend} size={args.size_mb} MiB in "
        f"{args.num_tensors} x {args.dtype}, bucket={args.bucket_mb} MiB"
    )
    for step in range(args.steps):
        nbytes, t_pub, t_ack, _ = times[step]
        same = "skipped" if args.no_verify else ("yes" if sent[step] == got[step] else "NO")
        print(
            f"step {step}: publish {t_pub * 1e3:8.1f} ms {nbytes / t_pub / 1e9:6.2f} GB/s | to "
            f"ack {t_ack * 1e3:8.1f} ms {nbytes / t_ack / 1e9:6.2f} GB/s | bit-identical: {same}"
            + (" (warm-up)" if step == 0 else "")
        )
    steady = [times[s] for s in range(1, args.steps)]
    if steady:
        nbytes = steady[0][0]
        print(
            f"mean over steps 1..{args.steps - 1}: publish "
            f"{nbytes / (sum(t[1] for t in steady) / len(steady)) / 1e9:.2f} GB/s, to "
            f"ack {nbytes / (sum(t[2] for t in steady) / len(steady)) / 1e9:.2f} GB/s"
        )
    if not args.no_verify and any(sent[s] != got[s] for s in range(args.steps)):
        raise SystemExit("checksum mismatch")


if __name__ == "__main__":
    main()
