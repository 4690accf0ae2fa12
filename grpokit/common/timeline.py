"""`timeline.jsonl`: when each role worked on each step (wall-clock seconds), for the async picture.

One JSON line per (role, step): {"role", "step", "start", "end", ...}. Lines are appended with a single
write each (O_APPEND), so the orchestrator and trainer can share the file across threads or processes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def record_timeline(run_dir: str | Path, role: str, step: int, start: float, end: float, **extra) -> None:
    line = json.dumps({"role": role, "step": step, "start": start, "end": end, **extra}) + "\n"
    fd = os.open(Path(run_dir) / "timeline.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def read_timeline(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "timeline.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
