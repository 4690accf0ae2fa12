"""Expert (gold) completions added to a batch, for losses that learn from demonstrations (Chord).

`data.expert` has two sources, one at a time: the examples' own reference answers (`field`, `template`:
ReferenceExperts) or a separate SFT dataset (`path`, `fields`, `per_step`: DatasetExperts, ms-swift's
`chord_sft_dataset`).

Reference answers: each group of the step gets one more sequence: the group's prompt followed by
the example's reference answer (the task data field `field`, written into `template`), tokenized with the
policy's tokenizer and ended with its EOS token, as a sampled completion that stopped would be. Expert
sequences are flagged (Rollout.is_expert -> MicroBatch.expert_mask_T): they are added after rewards,
advantages and filters, so they never enter a group's baseline, the reward metrics or the RL loss's
token mask; only a loss with `needs_experts` trains on them.

Every built-in environment keeps its reference in its task data: reverse-text, arithmetic and jsonl as
`answer` (the reply that earns full reward), countdown as `solution` (an expression; its replies are
scored inside <answer></answer>, hence `template: "<answer>{answer}</answer>"`).

An SFT dataset: read by grpokit.sft.sources (the formats and field mapping of `grpokit sft`'s data) and
rendered by grpokit.sft.render when the run starts (before the model loads, so a bad record stops the
start naming its key), each record a chat through the policy's chat template with its assistant tokens
as the trained tokens. Records longer than data.seq_len are dropped and counted. Step s draws the
records at positions s*per_step .. (s+1)*per_step - 1 of an endless sequence of passes, each shuffled by
(data.seed, pass) (grpokit.sft.sources.ShuffledPasses): a function of the step, so a resumed run draws
the same records for the same step. A record is split where its first assistant token is: the tokens
before it are the expert rollout's prompt, the rest its completion with the assistant mask (later user
or tool turns of a multi-turn chat are masked as an environment's turns are). Like reference experts,
they are added after advantages and filters, outside the RL loss mask.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from grpokit.environments.environment import Environment
from grpokit.sft.render import ChatRenderer, Rendered
from grpokit.sft.sources import SFTFields, ShuffledPasses, read_records, record_chats
from grpokit.types import Rollout
from grpokit.vision.inputs import prompt_inputs

log = logging.getLogger(__name__)


@dataclass
class ExpertSettings:
    """Expert completions for a loss that learns from demonstrations (Chord), from one of two sources:
    each group's reference answer (`field`, `template`; the default), or `per_step` records of an SFT
    dataset each step (`path`, `fields`, `split`; ms-swift's chord_sft_dataset). Not both.

    Args:
        field: the task data field holding the reference (e.g. answer, solution); null: `answer`, or
            no reference answers when `path` is set.
        template: the completion text; `{answer}` is replaced by the field's value (null: `{answer}`).
        path: an SFT dataset instead of reference answers: a JSONL, JSON, Parquet or CSV file, or a
            `datasets.save_to_disk` folder, of chats or prompt/completion pairs (as `grpokit sft` reads).
        fields: with `path`, the field mapping: which record fields hold `messages`, or `prompt` and
            `completion`, and `tools` (docs/sft.md).
        split: with `path` a folder holding a DatasetDict, the split to read.
        per_step: with `path`, records drawn per optimizer step (ms-swift's
            chord_sft_per_device_train_batch_size, for the whole step).
    """

    field: str | None = None
    template: str | None = None
    path: str | None = None
    fields: SFTFields | None = None
    split: str = "train"
    per_step: int = 8

    def __post_init__(self) -> None:
        if self.path is None:
            if self.fields is not None:
                raise ValueError(
                    "data.expert.fields maps the records of data.expert.path, which is not set: set "
                    "data.expert.path to an SFT dataset, or remove data.expert.fields"
                )
            self.field = "answer" if self.field is None else self.field
            self.template = "{answer}" if self.template is None else self.template
        elif self.field is not None or self.template is not None:
            raise ValueError(
                "data.expert has two sources: the reference answers (field, template) and an SFT dataset "
                "(path); set one: data.expert.field and data.expert.template null with data.expert.path "
                "(over a recipe that sets them, add --data.expert.field null --data.expert.template null), "
                "or data.expert.path null"
            )
        if self.per_step < 1:
            raise ValueError(
                f"data.expert.per_step must be >= 1 (SFT records drawn per step), got {self.per_step}; "
                "to add none, set data.expert: null"
            )


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
                vision=prompt_inputs(first.vision),  # the prompt's images: the expert answers the same pictures
            )
        )
    return out


class ReferenceExperts:
    """data.expert's reference answers: one expert Rollout per group (expert_rollouts)."""

    def __init__(self, settings: ExpertSettings, envs: list[Environment], tokenizer) -> None:
        self.settings, self.envs, self.tokenizer = settings, envs, tokenizer

    def rollouts(self, step: int, groups: list[list[Rollout]]) -> list[Rollout]:
        return expert_rollouts(groups, self.envs, self.tokenizer, self.settings)


class DatasetExperts:
    """data.expert's SFT dataset: `per_step` rendered records a step, drawn by the step (module docstring).

    Reads and renders every record when made; ValueError naming the key for a missing file, a record
    without the mapped fields or without an assistant turn, or no record within seq_len.
    """

    def __init__(self, settings: ExpertSettings, tokenizer, seq_len: int, seed: int) -> None:
        path, self.per_step = settings.path, settings.per_step
        if not Path(path).expanduser().exists():
            raise ValueError(
                f"data.expert.path {path!r}: no such file or folder; set data.expert.path to a JSONL, JSON, "
                "Parquet or CSV file, or a datasets.save_to_disk folder, of SFT records"
            )
        source = f"data.expert.path {path!r}"
        records = read_records(path, settings.split, key="data.expert")
        chats = record_chats(records, settings.fields or SFTFields(), source, key="data.expert")
        renderer = ChatRenderer(tokenizer)
        rendered = [renderer.render(m, t, f"{source} example {i}", "data.expert") for i, (m, t) in enumerate(chats)]
        self.records = [r for r in rendered if len(r.input_ids) <= seq_len]
        self.dropped = len(rendered) - len(self.records)
        if self.dropped:
            message = "data.expert: %d of %d records are over data.seq_len (%d tokens), dropped"
            log.warning(message, self.dropped, len(rendered), seq_len)
        if not self.records:
            raise ValueError(
                f"{source}: every record is over data.seq_len ({seq_len}) tokens; raise data.seq_len or use "
                "shorter records"
            )
        self.order = ShuffledPasses(len(self.records), seed)

    def rollouts(self, step: int, groups: list[list[Rollout]]) -> list[Rollout]:
        """The step's `per_step` records as expert Rollouts (the groups do not matter)."""
        policy_step = min((r.policy_step for g in groups for r in g), default=0)
        indices = self.order.take(step * self.per_step, self.per_step)
        return [dataset_rollout(self.records[i], i, policy_step) for i in indices]


def dataset_rollout(record: Rendered, index: int, policy_step: int) -> Rollout:
    """A rendered SFT record as an expert Rollout: the prompt up to its first assistant token, the rest
    as completion with the assistant mask (nothing was sampled: no logprobs, no reward)."""
    first = record.loss_mask.index(1)
    completion = record.input_ids[first:]
    return Rollout(
        example_id=index,
        env_id="data.expert",
        group_id=-1,  # no group: it is in no advantage's baseline
        prompt_ids=record.input_ids[:first],
        completion_ids=completion,
        completion_logprobs=[0.0] * len(completion),
        completion_mask=record.loss_mask[first:],
        reward=0.0,
        is_truncated=False,
        policy_step=policy_step,
        is_expert=True,
        vision=record.vision,
    )


def expert_source(
    settings: ExpertSettings, envs: list[Environment], tokenizer, seq_len: int, seed: int
) -> ReferenceExperts | DatasetExperts:
    """The source `settings` names: an SFT dataset with `path`, else the reference answers."""
    if settings.path is not None:
        return DatasetExperts(settings, tokenizer, seq_len, seed)
    return ReferenceExperts(settings, envs, tokenizer)
