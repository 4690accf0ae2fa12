"""A kill between the last checkpoint and the last weight push: the resumed run still publishes them.

Found by tests/faults/test_kills.py in CI: the process was killed after writing checkpoints/step_8.ckpt
and before broadcasts/step_8 was complete; the resumed run starts at max_steps, where Lightning runs
no training hooks, and ended without the final weights published.
"""

from __future__ import annotations

import shutil

from grpokit.main import main
from grpokit.testing import tiny_fit_argv


def test_resume_at_max_steps_publishes_the_final_weights(tmp_path, tiny_model):
    argv = tiny_fit_argv(
        tmp_path, tiny_model, "r", "--trainer.max_steps", "2", "--ckpt.interval", "2", "--data.eval", "null"
    )
    assert main(argv) == 0
    final = tmp_path / "r" / "broadcasts" / "step_2"
    assert (final / "STABLE").exists() and (tmp_path / "r" / "checkpoints" / "step_2.ckpt").exists()
    shutil.rmtree(final)  # what a kill right after the checkpoint leaves
    assert main(argv + ["--ckpt.resume_step", "-1"]) == 0
    assert (final / "STABLE").exists()
