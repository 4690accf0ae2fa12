"""Filesystem weight broadcast: `{run_dir}/broadcasts/step_N/` with a `STABLE` marker written last.

A LoRA update is a standard peft adapter folder (adapter_model.safetensors + adapter_config.json), so
vLLM's LoRA hot reload can load it as is; a full update is model.safetensors. QeRL's noisy norm weights,
when a noise scheduler is on, lie beside them in noisy_norms.safetensors (outside the adapter files, so
the adapter stays loadable by anything that reads peft adapters). Readers only open folders that hold
STABLE, so they never see a half-written step.

Content checksums: STABLE holds {"step", "checksums": {file: crc32}} of the step's files, computed by
the writer from the bytes it wrote (grpokit.common.checksums.bytes_checksum). `read` checks each file
it loads against them, so a file damaged after it was published (bytes flipped, a bad copy) is a
DamagedStepError naming the file and the step, never loaded into an engine; a step written by grpokit
before 2026-11-29 (STABLE holds only the step) is read unchecked, with one warning. That the engine then
holds what it read is checked by the engine's caller (grpokit.common.loaded_weights).

Retention never deletes a step a reader may still be loading. A reader acknowledges in every
`poll(after_step)` that it has finished loading `after_step` (callers pass the step their engine holds),
by writing `broadcasts/acks/<reader>.json` before it lists the steps; it loads only steps newer than its
ack, and a path-based engine (vLLM loads the adapter folder itself) has read the files of its step by
the time it polls again. After each publish the writer deletes step s only if
    s <= newest - keep_last   and   s < min(ack of every live reader)
so a reader far behind (slow to load, the writer many steps ahead) keeps its step on disk. A reader is
live while its ack file is younger than `reader_timeout` (each poll refreshes it, at most every few
seconds); a reader that died stops holding steps after that. `close()` removes the reader's ack.
"""

from __future__ import annotations

import itertools
import json
import logging
import mmap
import os
import shutil
import socket
import time
from pathlib import Path

from safetensors.torch import load_file, save

from grpokit.broadcast import WeightBroadcast
from grpokit.common.checksums import bytes_checksum
from grpokit.common.errors import RunDataError
from grpokit.common.io import atomic_folder, atomic_write_bytes, atomic_write_json, atomic_write_text
from grpokit.types import WeightUpdate

log = logging.getLogger(__name__)
ADAPTER_FILE, ADAPTER_CONFIG, FULL_FILE, STABLE = (
    "adapter_model.safetensors",
    "adapter_config.json",
    "model.safetensors",
    "STABLE",
)
NORMS_FILE = "noisy_norms.safetensors"
PROBE_FILE = "probe.json"  # the trainer's logprobs of the weight probe (grpokit.common.weight_probe)
_READERS = itertools.count()


_warned_unchecked = False  # a step without checksums was read: warned once per process


class DamagedStepError(RunDataError):
    """A published step (STABLE written) with a file that cannot be read: cut short or corrupt, or
    not the bytes the writer published (checksum). A RunDataError: `grpokit` prints it as one line."""


def _check(path: Path, data: bytes | mmap.mmap, checksums: dict | None, step: int) -> None:
    """Raise DamagedStepError unless `data`, read from `path`, matches the checksum STABLE holds for it
    (None: an unchecked step of an older grpokit)."""
    if checksums is None:
        return
    actual, published = bytes_checksum(data), checksums.get(path.name)
    if actual != published:
        raise DamagedStepError(
            f"FilesystemBroadcast step {step}: {path} is not what the trainer published (checksum {actual}, "
            f"published {published}): the file was damaged after it was written; not loaded. Delete "
            f"{path.parent} and resume the run from its newest checkpoint"
        )


def _load(path: Path, checksums: dict | None, step: int) -> dict:
    """The tensors of a checked safetensors file; an unreadable one is a DamagedStepError that names it
    (safetensors' own error does not). Parsed before the checksum is compared, so that a file cut short
    reads as one; the checksum reads the file through a memory map (no copy: the pages it reads are
    those the engine's load reads next)."""
    try:
        tensors = load_file(path)
    except FileNotFoundError:
        raise
    except Exception as e:  # safetensors raises SafetensorError for a truncated header or data
        raise DamagedStepError(
            f"{path} cannot be read ({type(e).__name__}: {e}): the file is cut short or corrupt"
        ) from e
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        _check(path, data, checksums, step)
    return tensors


def _probe(path: Path, checksums: dict | None, step: int) -> dict[str, list]:
    """The weight probe the trainer published with `step` (checked like every file of it)."""
    raw = path.read_bytes()
    _check(path, raw, checksums, step)
    try:
        probe = json.loads(raw)
        return {"token_ids": [int(t) for t in probe["token_ids"]], "logprobs": [float(x) for x in probe["logprobs"]]}
    except (ValueError, KeyError, TypeError) as e:
        raise DamagedStepError(f"{path} is not a weight probe: {e}") from e


class FilesystemBroadcast(WeightBroadcast):
    """Weights as folders `broadcasts/step_N/`, complete once `STABLE` exists."""

    def __init__(self, keep_last: int = 3, reader_timeout: float = 3600.0) -> None:
        """
        Args:
            keep_last: newest steps always kept on disk; older ones are deleted after each publish once
                every live reader has acknowledged a newer step.
            reader_timeout: seconds after its last poll that a reader's acknowledgement stops holding
                steps on disk (a reader that died); longer than any one weight load.
        """
        if keep_last < 2:
            raise ValueError(f"broadcast.init_args.keep_last must be >= 2, got {keep_last}")
        if reader_timeout <= 0:
            raise ValueError(f"broadcast.init_args.reader_timeout must be > 0 seconds, got {reader_timeout}")
        self.keep_last, self.reader_timeout = keep_last, reader_timeout
        self.reader_id = f"{socket.gethostname()}-{os.getpid()}-{next(_READERS)}"
        self._acked: tuple[int, float] | None = None  # (step, when) last written to the ack file

    @property
    def root(self) -> Path:
        return self.run_dir / "broadcasts"

    def step_dir(self, step: int) -> Path:
        return self.root / f"step_{step}"

    def publish(self, update: WeightUpdate) -> None:
        final = self.step_dir(update.step)
        if (final / STABLE).exists():
            return  # already published (a resumed run re-publishing the same step)
        with atomic_folder(final, self.root / f".step_{update.step}.{os.getpid()}.tmp") as tmp:
            checksums = self._write(tmp, update)  # a full disk, say: no half-written folder stays behind
        atomic_write_text(final / STABLE, json.dumps({"step": update.step, "checksums": checksums}))
        self._prune(update.step)

    def _write(self, folder: Path, update: WeightUpdate) -> dict[str, str]:
        """Write the update's files into `folder`; returns {file name: checksum of the bytes written}."""
        files = {}
        if update.lora_config is not None:
            files[ADAPTER_FILE] = _safetensors_bytes(update.tensors)
            files[ADAPTER_CONFIG] = json.dumps(update.lora_config, indent=2, sort_keys=True).encode()
        else:
            files[FULL_FILE] = _safetensors_bytes(update.tensors)
        if update.norm_tensors:
            files[NORMS_FILE] = _safetensors_bytes(update.norm_tensors)
        if update.probe is not None:
            files[PROBE_FILE] = json.dumps(update.probe).encode()
        for name, data in files.items():
            atomic_write_bytes(folder / name, data)
        return {name: bytes_checksum(data) for name, data in files.items()}

    def discard_after(self, step: int) -> None:
        """Also deletes the temp folders (`.step_N.<pid>.tmp`) of publishes a killed writer left half-done.
        Here, not in setup: every process of a run sets the broadcast up, and a reader starting while the
        trainer writes a step would delete the folder under it; discard_after runs only in the writer's
        process, before it publishes."""
        for tmp in self.root.glob(".step_*.tmp") if self.root.is_dir() else ():
            log.info("broadcast: deleting %s, left by a writer that stopped mid-publish", tmp.name)
            shutil.rmtree(tmp, ignore_errors=True)
        for newer in self.stable_steps():
            if newer > step:
                log.info(
                    "broadcast: discarding step %d, published before the trainer restarted at step %d", newer, step
                )
                (self.step_dir(newer) / STABLE).unlink(missing_ok=True)  # unlisted first, then deleted
                shutil.rmtree(self.step_dir(newer), ignore_errors=True)

    def stable_steps(self) -> list[int]:
        if not self.root.exists():
            return []
        steps = [int(p.name[5:]) for p in self.root.glob("step_*") if p.name[5:].isdigit() and (p / STABLE).exists()]
        return sorted(steps)

    def poll(self, after_step: int, upto: int | None = None) -> WeightUpdate | None:
        self.acknowledge(after_step)  # before listing: the writer keeps every step newer than this
        for step in reversed(self.stable_steps()):
            if upto is not None and step > upto:
                continue
            if step <= after_step:
                return None
            try:
                return self.read(step)
            except FileNotFoundError:  # pruned between listing and reading: try the next newest
                log.warning("broadcast step %d vanished while reading", step)
        return None

    def read(self, step: int) -> WeightUpdate:
        """The update of a published step; a file of it that cannot be read (cut short, corrupt) or is not
        the bytes the writer published (checksum) is a DamagedStepError naming the file and the step
        (FileNotFoundError if it is gone)."""
        d = self.step_dir(step)
        checksums = self.checksums(step)
        norms = _load(d / NORMS_FILE, checksums, step) if (d / NORMS_FILE).exists() else {}
        probe = _probe(d / PROBE_FILE, checksums, step) if (d / PROBE_FILE).exists() else None
        update = self._read_weights(d, checksums, step, norms)
        update.probe = probe
        return update

    def _read_weights(self, d: Path, checksums: dict | None, step: int, norms: dict) -> WeightUpdate:
        if (d / ADAPTER_FILE).exists():
            raw = (d / ADAPTER_CONFIG).read_bytes()
            try:
                config = json.loads(raw)
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise DamagedStepError(f"{d / ADAPTER_CONFIG} is not a JSON adapter config: {e}") from e
            _check(d / ADAPTER_CONFIG, raw, checksums, step)
            tensors = _load(d / ADAPTER_FILE, checksums, step)
            return WeightUpdate(step=step, tensors=tensors, lora_config=config, path=str(d), norm_tensors=norms)
        return WeightUpdate(step=step, tensors=_load(d / FULL_FILE, checksums, step), path=str(d), norm_tensors=norms)

    def checksums(self, step: int) -> dict[str, str] | None:
        """{file: checksum} that STABLE of `step` holds; None for a step an older grpokit wrote (STABLE
        holds only the step number), read unchecked with one warning: a run resumed across the upgrade
        loads the steps its trainer published before, which the trainer does not publish again."""
        global _warned_unchecked
        text = (self.step_dir(step) / STABLE).read_text()
        if text.strip().isdigit():
            if not _warned_unchecked:
                _warned_unchecked = True
                log.warning("broadcast step %d was written by grpokit before 2026-11-29: read without checksums", step)
            return None
        try:
            marker = json.loads(text)
            checksums = marker["checksums"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
            raise DamagedStepError(f"{self.step_dir(step) / STABLE} is damaged: {text[:80]!r} ({e})") from e
        if marker.get("step") != step or not isinstance(checksums, dict):
            raise DamagedStepError(f"{self.step_dir(step) / STABLE} is not the marker of step {step}: {text[:80]!r}")
        return checksums

    # ---- retention -------------------------------------------------------------------------------
    @property
    def ack_path(self) -> Path:
        return self.root / "acks" / f"{self.reader_id}.json"

    def acknowledge(self, step: int) -> None:
        """This reader has finished loading `step` (-1: nothing yet) and will only load newer steps."""
        now = time.time()
        if (
            self._acked is not None
            and self._acked[0] == step
            and now - self._acked[1] < min(10.0, self.reader_timeout / 10)
        ):
            return
        try:
            atomic_write_json(self.ack_path, {"reader": self.reader_id, "step": step})
        except OSError as e:  # a full disk: the previous ack, older, still holds at least the steps this one would
            log.warning("broadcast: could not acknowledge step %d (%s); reading on", step, e)
            return
        self._acked = (step, now)

    def oldest_needed_ack(self) -> int | None:
        """The smallest step acknowledged by a live reader (None without live readers)."""
        steps, now = [], time.time()
        for path in self.root.glob("acks/*.json"):
            try:
                if now - path.stat().st_mtime <= self.reader_timeout:
                    steps.append(int(json.loads(path.read_text())["step"]))
            except (OSError, ValueError, KeyError, TypeError):  # removed or being replaced meanwhile
                continue
        return min(steps, default=None)

    def _prune(self, newest: int) -> None:
        floor = self.oldest_needed_ack()
        for step in self.stable_steps():
            if step <= newest - self.keep_last and (floor is None or step < floor):
                (self.step_dir(step) / STABLE).unlink(missing_ok=True)  # unlisted first, then deleted
                shutil.rmtree(self.step_dir(step), ignore_errors=True)

    def close(self) -> None:
        """Withdraw this reader's acknowledgement: it holds no steps on disk any more."""
        if self._acked is not None:
            self.ack_path.unlink(missing_ok=True)
            self._acked = None


def _safetensors_bytes(tensors: dict) -> bytes:
    """Tensors as safetensors bytes (no pickle), `format: pt` as peft and vLLM expect."""
    return save({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, metadata={"format": "pt"})
