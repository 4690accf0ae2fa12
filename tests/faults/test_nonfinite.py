"""Numerics guard: a non-finite loss skips the optimizer step; N in a row stop the run, batch saved."""

import textwrap

import pytest
import torch
from safetensors.torch import load_file

from grpokit.main import main
from grpokit.testing import tiny_fit_argv
from grpokit.trainer.guards import NonFiniteError
from grpokit.transport.codec import decode_batch
from tests.support import read_metrics

NAN_LOSS = '''
import torch
from grpokit.loss import Loss

class NaNAtSteps(Loss):
    """AIPO-free test loss: mean -A*logp, NaN at the listed steps."""

    def __init__(self, steps: list[int] = []) -> None:
        self.steps = steps

    def __call__(self, inputs):
        loss = -(inputs.advantages_T * inputs.trainer_logprobs_T * inputs.loss_mask_T).sum() / inputs.loss_normalizer
        return (loss * float("nan") if inputs.step in self.steps else loss), {}
'''


def run(tmp_path, tiny_model, name, steps, *extra):
    argv = tiny_fit_argv(
        tmp_path,
        tiny_model,
        name,
        "--model.loss",
        "nan_loss.NaNAtSteps",
        "--model.loss.init_args.steps",
        str(steps),
        "--data.sampling.max_tokens",
        "6",
        "--data.eval",
        "null",
        "--data.max_async_level",
        "0",
        "--trainer.max_steps",
        "4",
        "--ckpt.interval",
        "0",
        "--broadcast.init_args.keep_last",
        "10",
        *extra,
    )
    return main(argv)


@pytest.fixture
def nan_loss_module(tmp_path, monkeypatch):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "nan_loss.py").write_text(textwrap.dedent(NAN_LOSS))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))


def test_one_nan_step_is_skipped_and_weights_are_untouched(tmp_path, tiny_model, nan_loss_module):
    assert run(tmp_path, tiny_model, "once", [1]) == 0
    rows = read_metrics(tmp_path / "once")
    assert [float(r["skipped_steps"]) for r in rows] == [0.0, 1.0, 1.0, 1.0]
    broadcasts = tmp_path / "once" / "broadcasts"
    after_step = {s: load_file(broadcasts / f"step_{s}" / "adapter_model.safetensors") for s in (1, 2, 3)}
    assert all(torch.equal(after_step[1][k], after_step[2][k]) for k in after_step[1])  # step 1 did not move them
    assert any(not torch.equal(after_step[2][k], after_step[3][k]) for k in after_step[2])  # step 2 did
    assert all(torch.isfinite(v).all() for v in after_step[3].values())


def test_consecutive_nan_steps_stop_the_run_with_the_batch_saved(tmp_path, tiny_model, nan_loss_module):
    with pytest.raises(NonFiniteError, match="2 consecutive steps"):
        run(tmp_path, tiny_model, "always", [0, 1, 2, 3], "--model.max_nonfinite_steps", "2")
    saved = tmp_path / "always" / "bad_batches" / "step_1.safetensors"
    assert decode_batch(saved.read_bytes()).step == 1
