"""`num_threads` belongs to the command it is given to: torch's thread count is process-wide, and a count
left behind made later commands in the same process round differently from a fresh process."""

import torch

from grpokit.main import main
from grpokit.testing import tiny_fit_argv


def test_a_commands_num_threads_is_given_back(tmp_path, tiny_model):
    before = torch.get_num_threads()
    other = 1 if before > 1 else 2
    argv = tiny_fit_argv(tmp_path, tiny_model, "r", "--trainer.max_steps", "1", "--num_threads", str(other))
    assert main([*argv, "--data.eval", "null", "--ckpt.interval", "0"]) == 0
    assert torch.get_num_threads() == before
