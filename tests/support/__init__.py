"""Helpers grpokit's own tests share and users do not need (what plugin authors use ships as
grpokit.testing: the contract checks, the tiny model, a free port).

- batches.py: seeded random TrainingBatches, and their exact comparison (transport tests).
- servers.py: a scripted misbehaving HTTP peer; the builtin engine behind grpokit's server.
- stand_ins.py: scripted task, environment and engine for multi-turn tests; draining a stream.
- processes.py: process groups, background threads, waiting for a condition.
- lora.py: a LoRA weight update for the tiny model.
- metrics.py: a run's metrics.csv rows (read_metrics).
- modules.py: a module written into a temporary site folder, importable for one test (installed_module).
- rollouts.py: hand-built Rollouts and groups (make_rollout, make_group).

Tests import them as `from tests.support import ...` (pyproject.toml puts the repository on pytest's path).
"""

from tests.support.batches import assert_same_batch, make_training_batch
from tests.support.lora import tiny_lora_update
from tests.support.metrics import read_metrics
from tests.support.modules import installed_module
from tests.support.processes import in_background, kill_after_checkpoint, process_group_gone, wait_until
from tests.support.rollouts import make_group, make_rollout
from tests.support.servers import ScriptedServer, serving, slow_forwards
from tests.support.stand_ins import MULTI_TURN_GAME_FLAGS, ChatLengthEnv, ReplyEngine, ToolReplyTask, drain, play

__all__ = [
    "MULTI_TURN_GAME_FLAGS",
    "ChatLengthEnv",
    "ReplyEngine",
    "ScriptedServer",
    "ToolReplyTask",
    "assert_same_batch",
    "drain",
    "in_background",
    "installed_module",
    "kill_after_checkpoint",
    "make_group",
    "make_rollout",
    "make_training_batch",
    "play",
    "process_group_gone",
    "read_metrics",
    "serving",
    "slow_forwards",
    "tiny_lora_update",
    "wait_until",
]
