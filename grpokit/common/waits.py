"""A wait that says so: the processes of a multi-process run wait for each other (the orchestrator for the
trainer's weights, the trainer for the orchestrator's batches) up to data.timeout, 30 minutes by default;
a process that waits without a word looks hung, and one started before its peer waits at once."""

from __future__ import annotations

import logging
import math
import time

log = logging.getLogger("grpokit.waits")


class WaitNotice:
    """`tick()` inside a polling loop logs `message` (INFO) once the wait has lasted `after` seconds, then
    every `every` seconds, with the seconds waited so far."""

    def __init__(self, message: str, after: float = 10.0, every: float = 120.0) -> None:
        self.message, self.every = message, every
        self.start = time.monotonic()
        self.next = self.start + after

    def tick(self) -> None:
        now = time.monotonic()
        if now >= self.next:
            log.info("%s (waiting %.0fs)", self.message, now - self.start)
            self.next = now + self.every


def check_seconds(key: str, value: float | None, none_ok: bool = False) -> None:
    """Refuse a timeout that is not a finite number of seconds > 0, naming its recipe key: NaN compares
    false with everything, so a wait bounded by it never ends; inf overflows the clocks' arithmetic."""
    if value is None and none_ok:
        return
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and value > 0):
        raise ValueError(f"{key} must be a finite number of seconds > 0, got {value!r}; set a positive number")
