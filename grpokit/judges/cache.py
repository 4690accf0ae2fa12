"""The run's judge replies, kept so that a resumed run scores as the uninterrupted one did.

A reply is stored under sha256(judge identity, what the judge was shown): for a generative judge the
rendered prompt (so the conversation, the rubric and the template), for a classifier the conversation.
A resumed run re-samples the steps after its checkpoint exactly (data.deterministic), so it asks the
same questions again and reads the stored replies instead: even a judge that samples, or a server whose
batching changes its float rounding, gives the first run's scores. Replies that came back are stored,
garbage included (it is the judge's answer and is scored by the same policy again); a timeout or a dead
endpoint stores nothing, so a resumed run asks again.

The file is `judge_cache.json` in the run folder, rewritten whole and atomically (grpokit.common.io)
after each batch that added a reply: a run killed mid-write leaves the previous file.
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

from grpokit.common.io import atomic_write_json

CACHE_FILE = "judge_cache.json"
CACHE_VERSION = 1


def cache_key(identity: str, shown: str) -> str:
    """The key of what `identity` (a judge) was shown."""
    return hashlib.sha256(json.dumps([identity, shown]).encode()).hexdigest()


class JudgeCache:
    """Replies by key, in memory, saved to `path` when one is set (attach)."""

    def __init__(self) -> None:
        self.replies: dict[str, str] = {}
        self.path: Path | None = None
        self.dirty = False
        self.lock = threading.Lock()

    def attach(self, run_dir: str | Path) -> None:
        """Keep the cache in `run_dir`, reading the replies an earlier attempt of the run stored there."""
        self.path = Path(run_dir) / CACHE_FILE
        if self.path.exists():
            stored = json.loads(self.path.read_text())
            if stored.get("version") != CACHE_VERSION:
                raise ValueError(f"{self.path}: judge cache version {stored.get('version')}, expected {CACHE_VERSION}")
            with self.lock:
                self.replies = {**stored["replies"], **self.replies}

    def get(self, key: str) -> str | None:
        with self.lock:
            return self.replies.get(key)

    def put(self, key: str, reply: str) -> None:
        with self.lock:
            self.replies[key] = reply
            self.dirty = True

    def save(self) -> None:
        """Write the replies to the run folder if any were added since the last save."""
        with self.lock:
            if self.path is None or not self.dirty:
                return
            atomic_write_json(self.path, {"version": CACHE_VERSION, "replies": self.replies})
            self.dirty = False
