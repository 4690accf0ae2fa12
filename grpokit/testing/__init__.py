"""Test helpers shipped with grpokit: the components' contract checks, for plugin authors to run on
their own classes, and what grpokit's own tests and benches share.

    from grpokit.testing import check_component
    check_component(MyLoss)          # raises AssertionError naming the broken rule

- contracts.py: check_component and the checks per kind; float64 LossInputs for hand-computed tests.
- batches.py: seeded random TrainingBatches, and their exact comparison.
- models.py: the tiny random model, a LoRA update for it, and the CLI arguments of a short run on it.
- servers.py: a scripted misbehaving HTTP peer; the builtin engine behind grpokit's server.
- stand_ins.py: scripted task, environment and engine for multi-turn tests; draining a stream.
- processes.py: free ports, process groups, background threads, waiting for a condition.
"""

from grpokit.testing.batches import assert_same_batch, make_training_batch
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
from grpokit.testing.models import build_tiny_model, tiny_fit_argv, tiny_lora_update
from grpokit.testing.processes import free_port, in_background, process_group_gone, wait_until
from grpokit.testing.servers import ScriptedServer, serving, slow_forwards
from grpokit.testing.stand_ins import MULTI_TURN_GAME_FLAGS, ChatLengthEnv, ReplyEngine, ToolReplyTask, drain, play

__all__ = [
    "MULTI_TURN_GAME_FLAGS",
    "ChatLengthEnv",
    "ReplyEngine",
    "ScriptedServer",
    "StubTokenizer",
    "ToolReplyTask",
    "assert_same_batch",
    "build_tiny_model",
    "check_advantage",
    "check_component",
    "check_filter",
    "check_loss",
    "check_noise_scheduler",
    "drain",
    "free_port",
    "in_background",
    "loss_and_grad",
    "loss_inputs",
    "make_loss_inputs",
    "make_training_batch",
    "play",
    "process_group_gone",
    "serving",
    "slow_forwards",
    "tiny_fit_argv",
    "tiny_lora_update",
    "wait_until",
]
