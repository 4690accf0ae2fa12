"""SFTData: the `data` section of `grpokit sft`, a LightningDataModule that hands the Policy one
TrainingBatch per optimizer step, as the GRPO Orchestrator does, so the trainer is the same.

Every example is read and rendered when the run starts (`prepare`, before the model loads), so a
missing field, an empty assistant turn or a template that cannot mark assistant spans stops the start
in seconds, naming the key. Step s trains the examples at positions s*B .. s*B + B - 1 of an endless
sequence of shuffled passes (pass e is a permutation seeded by (seed, e)): a function of the step, so a
resumed run trains exactly what the killed one would have. Each step's examples are packed into
micro-batches of at most `seq_len` tokens (grpokit.orchestrator.packing, first-fit decreasing), as
rollouts whose whole sequence is the completion and whose mask is the assistant mask (a multi-turn
rollout's environment tokens are masked the same way). Shape legend: B examples per step.
"""

from __future__ import annotations

import logging
import math
from typing import Literal

import lightning as L
import torch

from grpokit.common.models import load_tokenizer
from grpokit.environments import EnvSpec
from grpokit.orchestrator.packing import pack
from grpokit.sft.render import ChatRenderer, Rendered
from grpokit.sft.sources import SFTFields, ShuffledPasses, environment_chats, read_records, record_chats
from grpokit.types import MicroBatch, Rollout, TrainingBatch
from grpokit.vision.images import PixelBudget

log = logging.getLogger(__name__)


class SFTData(L.LightningDataModule):
    """Supervised fine-tuning examples (chats, prompt/completion pairs, or an environment's answers)."""

    def __init__(
        self,
        path: str | None = None,
        split: str = "train",
        fields: SFTFields | None = None,
        env: list[EnvSpec] | None = None,
        answer_field: str = "answer",
        answer_template: str = "{answer}",
        batch_size: int = 8,
        seq_len: int = 2048,
        max_length: int | None = None,
        overlong: Literal["drop", "truncate"] = "drop",
        eval_fraction: float = 0.0,
        eval_path: str | None = None,
        eval_interval: int = 10,
        tokenizer: str | None = None,
        seed: int | None = None,
        pixel_budget: PixelBudget | None = None,
    ) -> None:
        """
        Args:
            path: a JSONL, JSON, Parquet or CSV file, or a `datasets.save_to_disk` folder, of examples.
            split: the split to read from a folder holding a DatasetDict.
            fields: the field mapping: which record fields hold `messages`, or `prompt` and `completion`,
                and `tools`.
            env: instead of `path`: environments (as in `grpokit fit`'s data.env) whose examples are
                answered with their own reference answers.
            answer_field: with `env`, the task data field holding the reference answer.
            answer_template: with `env`, the assistant's reply; `{answer}` is replaced by the field's value.
            batch_size: examples per optimizer step (B).
            seq_len: tokens per micro-batch (the packing capacity); examples of a step are packed into as
                few micro-batches as fit.
            max_length: the longest example in tokens (null: seq_len, the most a micro-batch holds).
            overlong: what happens to a longer example: drop it, or truncate it to max_length (its
                assistant tokens after the cut are lost). Counted and logged at the start.
            eval_fraction: the share of the examples held out for evaluation (eval_loss,
                eval_token_accuracy), chosen by the seed; 0 with no eval_path: no evaluation.
            eval_path: a file or folder of held-out examples (same formats and fields), instead of eval_fraction.
            eval_interval: evaluate the weights of steps 0, eval_interval, 2 * eval_interval, ... and the last.
            tokenizer: the tokenizer whose chat template renders the data; null: the policy's
                (model.model), exactly as rollouts are rendered. Another must be the same tokenizer.
            seed: shuffles the examples and chooses the held-out ones (null: seed_everything).
            pixel_budget: examples with images: their limits, as `grpokit fit`'s (a refusal stops the start).
        """
        super().__init__()
        check_settings(path is not None, env is not None, batch_size, seq_len, max_length, eval_interval)
        if not 0 <= eval_fraction < 1 or (eval_fraction and eval_path):
            raise ValueError(f"data.eval_fraction must be in [0, 1) and unset with data.eval_path, got {eval_fraction}")
        self.path, self.split, self.fields, self.env = path, split, fields or SFTFields(), env
        self.answer_field, self.answer_template = answer_field, answer_template
        self.batch_size, self.seq_len, self.max_length = batch_size, seq_len, max_length or seq_len
        self.overlong, self.eval_fraction, self.eval_path = overlong, eval_fraction, eval_path
        self.eval_interval, self.tokenizer_name = eval_interval, tokenizer
        self.seed, self.pixel_budget = 0 if seed is None else seed, pixel_budget  # the CLI fills a null seed
        self.train_examples: list[Rendered] = []
        self.eval_examples: list[Rendered] = []
        self.max_steps, self.start_step = 0, 0
        self._order: ShuffledPasses | None = None
        self.overlong_counts: dict[str, tuple[int, int]] = {}  # training / eval: (truncated, dropped)

    # ---- start: read, render, split (before the model loads) ---------------------------------------
    def tokenizer_for(self, model: str):
        """The tokenizer that renders the data: the policy's, or data.tokenizer if it is the same one."""
        policy = load_tokenizer(model)
        if self.tokenizer_name is None:
            return policy
        other = load_tokenizer(self.tokenizer_name)
        if other.get_vocab() != policy.get_vocab() or other.chat_template != policy.chat_template:
            raise ValueError(
                f"data.tokenizer {self.tokenizer_name!r} differs from the policy's (model.model {model!r}) in its "
                "vocabulary or chat template: the policy would learn ids its rollouts never see; set "
                "data.tokenizer: null to render with the policy's tokenizer"
            )
        return other

    def prepare(self, tokenizer) -> None:
        """Read and render every example; hold out the eval share; drop or cut the over-long ones."""
        renderer = ChatRenderer(tokenizer, self.pixel_budget)
        examples = self._render(renderer, self._chats(self.path), self.path or "data.env")
        held_out = self._render(renderer, self._chats(self.eval_path), self.eval_path) if self.eval_path else []
        if self.eval_fraction:
            order = torch.randperm(len(examples), generator=torch.Generator().manual_seed(self.seed)).tolist()
            k = max(1, round(self.eval_fraction * len(examples)))
            held_out, examples = [examples[i] for i in order[:k]], [examples[i] for i in sorted(order[k:])]
        self.train_examples = self._fitted(examples, "training")
        self.eval_examples = self._fitted(held_out, "eval")
        if not self.train_examples:
            raise ValueError(
                f"no training example is left (each is over data.max_length {self.max_length} tokens or held "
                "out): raise data.max_length/data.seq_len, set data.overlong: truncate, or lower data.eval_fraction"
            )

    def _chats(self, path: str | None):
        if path is None:
            return environment_chats(self.env, self.answer_field, self.answer_template)
        return record_chats(read_records(path, self.split), self.fields, f"data.path {path!r}")

    @staticmethod
    def _render(renderer: ChatRenderer, chats, source: str) -> list[Rendered]:
        return [renderer.render(m, tools, f"{source} example {i}") for i, (m, tools) in enumerate(chats)]

    def _fitted(self, examples: list[Rendered], which: str) -> list[Rendered]:
        """Examples of at most max_length tokens: longer ones dropped or cut (an example cut before its
        first assistant token is dropped too, and one with images is never cut); the counts are logged."""
        out, cut, dropped = [], 0, 0
        for ex in examples:
            if len(ex.input_ids) > self.max_length and self.overlong == "truncate" and ex.vision is None:
                ex, cut = ex.cut(self.max_length), cut + 1
            if len(ex.input_ids) > self.max_length or not any(ex.loss_mask):
                dropped += 1
                continue
            out.append(ex)
        if cut or dropped:
            message = "data.max_length %d: of %d %s examples, %d cut, %d dropped (data.overlong: %s)"
            log.warning(message, self.max_length, len(examples), which, cut, dropped, self.overlong)
        self.overlong_counts[which] = (cut, dropped)
        return out

    def connect(self, max_steps: int, start_step: int = 0) -> int:
        """Serve steps start_step .. max_steps - 1 (max_steps -1: one pass over the examples); returns
        the number of steps."""
        self.max_steps = max_steps if max_steps != -1 else math.ceil(len(self.train_examples) / self.batch_size)
        self.start_step = start_step
        return self.max_steps

    # ---- the trainer's side ----------------------------------------------------------------------------
    def train_dataloader(self):
        return StepBatches(self)

    def example_indices(self, step: int) -> list[int]:
        """The B examples of `step`: positions step*B .. of the endless sequence of shuffled passes."""
        if self._order is None or self._order.n != len(self.train_examples):
            self._order = ShuffledPasses(len(self.train_examples), self.seed)
        return self._order.take(step * self.batch_size, self.batch_size)

    def eval_batch(self) -> list[MicroBatch]:
        """The held-out examples, packed into micro-batches of at most seq_len tokens; an example with images
        is a micro-batch of its own (the eval's forward gives one sequence its image inputs)."""
        rollouts = [as_rollout(example, i) for i, example in enumerate(self.eval_examples)]
        plain = [r for r in rollouts if r.vision is None]
        batches = pack(plain, [[0.0] * r.num_tokens for r in plain], [True] * len(plain), self.seq_len) if plain else []
        return batches + [pack([r], [[0.0] * r.num_tokens], [True], self.seq_len)[0] for r in rollouts if r.vision]

    def batch(self, step: int) -> TrainingBatch:
        """The TrainingBatch of `step`: its examples packed into micro-batches of at most seq_len tokens."""
        indices = self.example_indices(step)
        rollouts = [as_rollout(self.train_examples[i], i) for i in indices]
        micro_batches = pack(rollouts, [[0.0] * r.num_tokens for r in rollouts], [True] * len(rollouts), self.seq_len)
        metrics = {
            "epoch": step * self.batch_size / len(self.train_examples),
            "truncated_seqs": float(sum(r.is_truncated for r in rollouts)),
            "seq_len": sum(r.num_tokens for r in rollouts) / len(rollouts),
        }
        return TrainingBatch(step=step, micro_batches=micro_batches, temperature=1.0, metrics=metrics)


def check_settings(
    has_path: bool, has_env: bool, batch_size: int, seq_len: int, max_length: int | None, eval_interval: int
) -> None:
    """SFTData's settings that go wrong on their own, refused naming the key."""
    if has_path == has_env:
        raise ValueError(
            "set one of data.path (a file or folder of examples) and data.env (environments whose "
            "reference answers are the replies); over a recipe that sets the other, add --data.env null "
            "or --data.path null"
        )
    for key, value, low in (
        ("batch_size", batch_size, 1),
        ("seq_len", seq_len, 2),
        ("eval_interval", eval_interval, 1),
    ):
        if value < low:
            raise ValueError(f"data.{key} must be >= {low}, got {value}")
    if max_length is not None and not 2 <= max_length <= seq_len:
        raise ValueError(f"data.max_length ({max_length}) must be in [2, data.seq_len ({seq_len})]")


def as_rollout(example: Rendered, index: int) -> Rollout:
    """An example as packing takes it: no prompt, the whole sequence as completion, the assistant mask
    as completion mask (nothing was sampled: no logprobs, no reward)."""
    n = len(example.input_ids)
    return Rollout(
        example_id=index,
        env_id="sft",
        group_id=index,
        prompt_ids=[],
        completion_ids=list(example.input_ids),
        completion_logprobs=[0.0] * n,
        completion_mask=list(example.loss_mask),
        reward=0.0,
        is_truncated=example.truncated,
        policy_step=0,
        vision=example.vision,
    )


class StepBatches:
    """The trainer's dataloader: the batch of step start_step, start_step + 1, ... max_steps - 1. Every
    trainer rank builds the same batches (they are a function of the step) and trains its share."""

    def __init__(self, data: SFTData) -> None:
        self.data = data

    def __iter__(self):
        for step in range(self.data.start_step, self.data.max_steps):
            yield self.data.batch(step)
