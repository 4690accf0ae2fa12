"""Recorded rollouts as a transport: the trainer receives batches recorded earlier instead of fresh ones.

`grpokit rollouts record DIR` keeps every batch of a run in DIR (the filesystem transport's files,
codec.py's format) with manifest.json holding each file's sha256. Training on DIR with this transport
(`grpokit rollouts replay DIR`, or a sweep with `rollouts: DIR`) gives every variant the same samples,
byte for byte: each batch is checked against its recorded checksum, and the checksum of every batch
received is appended to `{run_dir}/replayed.jsonl`.

What the recorded batches fix: the prompts, completions, rewards, the engine's logprobs and the
advantages and filter masks of the recording run. The loss, and everything else on the trainer's side,
is recomputed by each variant; the importance ratio against the recorded logprobs is the off-policy
correction, as for any stale batch.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from grpokit.transport import Transport
from grpokit.transport.codec import BatchFormatError, decode_batch_file
from grpokit.types import TrainingBatch

MANIFEST, FORMAT, VERSION = "manifest.json", "grpokit.RecordedRollouts", 1


def batch_file(folder: Path, step: int) -> Path:
    return folder / f"step_{step}.safetensors"


def read_manifest(folder: Path, key: str = "data.transport.init_args.path") -> dict:
    """The manifest of a recorded-rollouts folder; a clear error naming `key` when it is not one."""
    path = folder / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(
            f"{key}={folder}: no {MANIFEST}; record one with `grpokit rollouts record {folder} --config RECIPE`"
        )
    manifest = json.loads(path.read_text())
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise BatchFormatError(f"{key}={folder}: {MANIFEST} is not {FORMAT} version {VERSION}")
    return manifest


class RecordedRollouts(Transport):
    """Replays batches recorded by `grpokit rollouts record` (checksum-verified); sends nothing."""

    def __init__(self, path: str | None = None) -> None:
        """
        Args:
            path: the folder `grpokit rollouts record` wrote (manifest.json + step_N.safetensors).
        """
        self.path = path

    def setup(self, run_dir: str | Path) -> None:
        super().setup(run_dir)
        if self.path is None:
            raise ValueError(
                "data.transport RecordedRollouts needs init_args.path: the folder `grpokit rollouts record` wrote"
            )
        self.checksums = {int(step): digest for step, digest in read_manifest(Path(self.path))["sha256"].items()}

    def has(self, step: int) -> bool:
        return step in self.checksums

    def source(self, step: int) -> str:
        return f"data.transport RecordedRollouts file {batch_file(Path(self.path), step)}"

    def send(self, batch: TrainingBatch) -> None:
        raise RuntimeError(
            "data.transport RecordedRollouts replays recorded batches and takes no new ones: train with "
            "`grpokit rollouts replay` (or `grpokit train`), which runs no orchestrator, not `grpokit fit`"
        )

    def receive(self, step: int, timeout: float) -> TrainingBatch:
        if step not in self.checksums:
            raise FileNotFoundError(
                f"data.transport.init_args.path={self.path} holds steps 0..{len(self.checksums) - 1}, "
                f"not step {step}: set trainer.max_steps <= {len(self.checksums)}"
            )
        data = batch_file(Path(self.path), step).read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        if digest != self.checksums[step]:
            raise BatchFormatError(
                f"{batch_file(Path(self.path), step)} changed since it was "
                f"recorded (sha256 {digest}, manifest {self.checksums[step]})"
            )
        with open(self.run_dir / "replayed.jsonl", "a") as f:
            f.write(json.dumps({"step": step, "sha256": digest}) + "\n")
        return decode_batch_file(batch_file(Path(self.path), step), data, "record the rollouts again")
