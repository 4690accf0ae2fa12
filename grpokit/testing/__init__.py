"""Test helpers shipped with grpokit, for plugin authors: the components' contract checks, to run on
their own classes, and a tiny random model to run a short fit on (grpokit's benches use it too).

    from grpokit.testing import check_component
    check_component(MyLoss)          # raises AssertionError naming the broken rule

- contracts.py: check_component and the checks per kind; float64 LossInputs for hand-computed tests.
- models.py: the tiny random model, and the CLI arguments of a short run on it.
- vision_models.py: tiny random vision-language models (Qwen2.5-VL, Idefics3) with working processors.
- processes.py: a free loopback port, for a server the test (or bench) starts.

Helpers only grpokit's own tests use (batches, scripted servers, stand-ins) live in tests/support/.
"""

from grpokit.testing.contracts import (
    StubTokenizer,
    check_advantage,
    check_component,
    check_filter,
    check_loss,
    check_noise_scheduler,
    loss_and_grad,
    loss_inputs,
    make_loss_inputs,
)
from grpokit.testing.models import build_tiny_model, tiny_fit_argv
from grpokit.testing.processes import free_port
from grpokit.testing.vision_models import build_tiny_idefics3, build_tiny_qwen2_5_vl

__all__ = [
    "StubTokenizer",
    "build_tiny_idefics3",
    "build_tiny_model",
    "build_tiny_qwen2_5_vl",
    "check_advantage",
    "check_component",
    "check_filter",
    "check_loss",
    "check_noise_scheduler",
    "free_port",
    "loss_and_grad",
    "loss_inputs",
    "make_loss_inputs",
    "tiny_fit_argv",
]
