"""Environments: verifiers (v1) tasksets loaded by id, scored, and played turn by turn (tools, toolsets,
`respond`, verifiers Env episodes). The orchestrator's producer drives them; nothing here imports it.

What an environment author uses (docs/environments.md):
    EnvTurn: what a task's `respond(messages, state)` returns for the environment's turn.
    tool_schemas: a task's plain `tools` as JSON schemas, for its system prompt.
    Environment, EnvSpec: load an environment by id (as `data.env` does) and score replies.
"""

from grpokit.environments.conversation import EnvTurn
from grpokit.environments.environment import Environment, EnvSpec
from grpokit.environments.tools import tool_schemas

__all__ = ["EnvSpec", "EnvTurn", "Environment", "tool_schemas"]
