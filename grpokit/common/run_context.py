"""RunContext: where a run lives and where this process starts in it.

Resolved by grpokit.run.open_run from the recipe's run_name, output_dir and ckpt; it sits down here, below
the roles, because the roles' wiring takes it too (the orchestrator's connect(): the run folder, the
resume step, whether to restore the easy/hard pools).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class RunContext:
    """Where a run lives and where this process starts in it: what every role's wiring reads.

    Attributes:
        run_dir: `{output_dir}/{run_name}`, shared by the processes of a run.
        run_name_given: whether the recipe named the run (several trainer processes must).
        start_step: the first step this process trains or produces (a resumed run's checkpoint step).
        resuming: ckpt.resume_step continues the count (not ckpt.skip_progress).
        restart_from: ckpt.skip_progress: (checkpoint, its step), whose weights start a new count.
        restore_buffer: restore the easy/hard pools of start_step (not ckpt.skip_buffer).
    """

    run_dir: Path
    run_name_given: bool
    start_step: int = 0
    resuming: bool = False
    restart_from: tuple[Path, int] | None = None
    restore_buffer: bool = True
