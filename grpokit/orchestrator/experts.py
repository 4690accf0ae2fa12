"""Expert (gold) completions added to a batch, for losses that learn from demonstrations (Chord).

With `data.expert` set, each group of the step gets one more sequence: the group's prompt followed by
the example's reference answer (the task data field `field`, written into `template`), tokenized with the
policy's tokenizer and ended with its EOS token, as a sampled completion that stopped would be. Expert
sequences are flagged (Rollout.is_expert -> MicroBatch.expert_mask_T): they are added after rewards,
advantages and filters, so they never enter a group's baseline, the reward metrics or the RL loss's
token mask; only a loss with `needs_experts` trains on them.

Every built-in environment keeps its reference in its task data: reverse-text, arithmetic and jsonl as
`answer` (the reply that earns full reward), countdown as `solution` (an expression; its replies are
scored inside <answer></answer>, hence `template: "<answer>{answer}</answer>"`).
"""

from __future__ import annotations

from dataclasses import dataclass

from grpokit.environments.environment import Environment
from grpokit.types import Rollout


@dataclass
class ExpertSettings:
    """One expert completion per group, from the example's reference answer.

    Args:
        field: the task data field holding the reference (e.g. answer, solution).
        template: the completion text; `{answer}` is replaced by the field's value.
    """

    field: str = "answer"
    template: str = "{answer}"


def expert_rollouts(
    groups: list[list[Rollout]], envs: list[Environment], tokenizer, settings: ExpertSettings
) -> list[Rollout]:
    """One expert Rollout per group: the group's prompt, the reference completion, is_expert=True."""
    by_name = {env.name: env for env in envs}
    out = []
    for group in groups:
        first = group[0]
        data = by_name[first.env_id].examples[first.example_id].task.data
        if not hasattr(data, settings.field):
            raise ValueError(
                f"data.expert.field is {settings.field!r}, but environment {first.env_id!r} "
                f"example {first.example_id} has no such field in its task data: set "
                "data.expert.field to the field holding its reference answer, or remove data.expert"
            )
        text = settings.template.format(answer=getattr(data, settings.field))
        ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
        out.append(
            Rollout(
                example_id=first.example_id,
                env_id=first.env_id,
                group_id=first.group_id,
                prompt_ids=list(first.prompt_ids),
                completion_ids=ids,
                completion_logprobs=[0.0] * len(ids),
                completion_mask=[1] * len(ids),
                reward=0.0,
                is_truncated=False,
                policy_step=min(r.policy_step for r in group),
                completion_text=text,
                is_expert=True,
            )
        )
    return out
