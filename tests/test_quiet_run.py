"""A run prints what a user can act on: none of the library notices every run used to print (transformers'
past_key_values rename, Lightning's weights_only default and dataloader_iter notices, deprecations
inside Lightning and peft, Lightning's advert for its cloud logger)."""

import subprocess
import sys

from grpokit.testing import tiny_fit_argv

NOTICES = ("past_key_values", "weights_only", "dataloader_iter", "LeafSpec", "is_gradient_checkpointing", "litlogger")


def test_a_fit_with_checkpoints_prints_no_library_notices(tmp_path, tiny_model):
    argv = tiny_fit_argv(tmp_path, tiny_model, "r", "--trainer.max_steps", "2", "--ckpt.interval", "1")
    done = subprocess.run([sys.executable, "-m", "grpokit", *argv], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = done.stdout + done.stderr
    assert list((tmp_path / "r" / "checkpoints").glob("step_*.ckpt")), "the run saved checkpoints (Lightning's notice)"
    assert [n for n in NOTICES if n in printed] == [], printed[-3000:]
