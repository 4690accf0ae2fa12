"""Once per key: for warnings that would otherwise repeat on every rollout (a tool's bad result, a picture
it cannot use). Thread-safe, since tools run on worker threads; per process, never reset."""

from __future__ import annotations

import threading
from collections.abc import Hashable


class Once:
    """`first(key)` is True the first time `key` is seen in this process, False after."""

    def __init__(self) -> None:
        self._seen: set[Hashable] = set()
        self._lock = threading.Lock()

    def first(self, key: Hashable) -> bool:
        with self._lock:
            if key in self._seen:
                return False
            self._seen.add(key)
            return True
