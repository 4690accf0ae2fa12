"""The contracts every role agrees on: what a rollout, a training batch and a weight update hold.

Plain tensors and Python scalars only, so a transport can serialise them without pickle.

Shape legend: N sequences in a micro-batch, T packed tokens in a micro-batch, C completion tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # the plug-in API layer imports nothing of grpokit's at run time
    from grpokit.vision.inputs import VisionInputs


@dataclass
class Rollout:
    """One sampled completion of one prompt, scored by its environment.

    Attributes:
        example_id: index of the example in its environment's dataset.
        env_id: the environment that produced the prompt and the reward.
        group_id: rollouts of the same prompt in the same step share a group id.
        prompt_ids: prompt token ids (chat template applied).
        completion_ids: sampled completion token ids, EOS included when it was sampled.
        completion_logprobs: the engine's log-probability of each completion token (len == len(completion_ids)).
        completion_mask: 1 where the policy wrote the token (trained on), 0 where the environment did.
        reward: scalar reward from the environment's rubric.
        is_truncated: the completion hit max_tokens without EOS.
        policy_step: the trainer step of the weights that sampled it.
        completion_text: decoded completion, for logs and samples.
        metrics: per-rollout environment metrics.
        step_rewards: the environment's reward of each reasoning step of the completion (process
            supervision), or None when its task reports none (see
            grpokit.environments.environment.Environment.step_rewards).
        step_ends: for each step, the index in completion_ids of its last token (ascending).
        is_expert: an expert (gold) completion the orchestrator added (`data.expert`), not sampled: it
            has no reward, advantage or inference logprobs and is trained on only by losses with
            `needs_experts` (Chord's SFT term).
        messages: a multi-turn rollout's whole chat (prompt, replies, tool results, the environment's
            messages) for samples.jsonl; None for a single-turn one. Its completion_ids hold every turn,
            the environment's tokens with completion_mask 0 (grpokit.environments.multi_turn).
        token_steps: per completion token, the weight step that produced it, when the engine loaded new
            weights while decoding it (streaming rollouts, grpokit.orchestrator.streaming); None when
            one step sampled it all. policy_step is then its oldest token's step.
        finish_reason: why the completion ended (grpokit.inference.finish): "stop" (a natural stop),
            "length" (max_tokens or the conversation's budget; is_truncated) or "abort" (cut before it
            finished: never trained on, see grpokit.orchestrator.rollouts). None derives it from
            is_truncated. A multi-turn rollout's is its last turn's.
        turn_finish_reasons: a multi-turn rollout's finish reason of each assistant turn; None for a
            single-turn one.
        notes: text about the rollout for samples.jsonl, by name (a judge's reply: `judge/<name>/reply`,
            grpokit.judges). An environment's scoring returns it among its metrics as a str, moved here
            when the rollout is made, so that `metrics` holds numbers only.
        vision: the image inputs of its prompt (grpokit.vision.inputs.VisionInputs: pixel values, image
            grids), shared by its group's rollouts; None for a text prompt. prompt_ids then hold the
            image placeholder tokens the processor expanded (grpokit.vision.render).
    """

    example_id: int
    env_id: str
    group_id: int
    prompt_ids: list[int]
    completion_ids: list[int]
    completion_logprobs: list[float]
    completion_mask: list[int]
    reward: float
    is_truncated: bool
    policy_step: int
    completion_text: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    step_rewards: list[float] | None = None
    step_ends: list[int] | None = None
    is_expert: bool = False
    messages: list[dict] | None = None
    token_steps: list[int] | None = None
    finish_reason: str | None = None
    turn_finish_reasons: list[str] | None = None
    notes: dict[str, str] = field(default_factory=dict)
    vision: VisionInputs | None = None

    def __post_init__(self) -> None:
        if any(isinstance(v, str) for v in self.metrics.values()):
            self.notes = {**self.notes, **{k: v for k, v in self.metrics.items() if isinstance(v, str)}}
            self.metrics = {k: v for k, v in self.metrics.items() if not isinstance(v, str)}
        if self.finish_reason is None:
            self.finish_reason = "length" if self.is_truncated else "stop"
        n = len(self.completion_ids)
        if len(self.completion_logprobs) != n or len(self.completion_mask) != n:
            raise ValueError(
                f"rollout {self.example_id}: completion_ids ({n}), completion_logprobs "
                f"({len(self.completion_logprobs)}) and completion_mask ({len(self.completion_mask)}) "
                "must have the same length"
            )
        if (self.step_rewards is None) != (self.step_ends is None) or len(self.step_rewards or []) != len(
            self.step_ends or []
        ):
            raise ValueError(
                f"rollout {self.example_id}: step_rewards and step_ends must both be None or have the same length"
            )
        if any(not 0 <= e < n for e in self.step_ends or []) or sorted(self.step_ends or []) != list(
            self.step_ends or []
        ):
            raise ValueError(
                f"rollout {self.example_id}: step_ends {self.step_ends} "
                f"must ascend and index completion_ids (0..{n - 1})"
            )

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)


@dataclass
class PrefixTree:
    """The trie of a packed row (grpokit.common.prefix_tree): one node per distinct prefix.

    Attributes:
        input_ids_U: each node's token.
        position_ids_U: each node's depth (its tokens' position inside their sequences).
        node_T: the node of each packed token.
        parent_U: each node's parent (-1 for a sequence's first token); parents precede children.
    """

    input_ids_U: torch.Tensor
    position_ids_U: torch.Tensor
    node_T: torch.Tensor
    parent_U: torch.Tensor
    _masks: dict = field(default_factory=dict, repr=False, compare=False)  # attention masks built so far

    @property
    def num_nodes(self) -> int:
        return int(self.input_ids_U.numel())

    def attention_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """Additive [1, 1, U, U] mask: 0 where node q may attend to node k (k is q or an ancestor of q).
        Built once per dtype and device (the policy, reference and teacher forwards share it)."""
        u, device = self.num_nodes, self.input_ids_U.device
        key = (dtype, device)
        if key in self._masks:
            return self._masks[key]
        allowed_UU = torch.eye(u, dtype=torch.bool, device=device)
        for depth in range(1, int(self.position_ids_U.max()) + 1 if u else 1):  # parents are one level up
            rows = (self.position_ids_U == depth).nonzero().squeeze(-1)
            allowed_UU[rows] |= allowed_UU[self.parent_U[rows]]
        mask = torch.zeros(u, u, dtype=dtype, device=device).masked_fill_(~allowed_UU, torch.finfo(dtype).min)
        self._masks[key] = mask[None, None]
        return self._masks[key]


@dataclass
class MicroBatch:
    """Sequences packed end to end into one row of T tokens.

    Token t's fields describe the prediction of input_ids[t] from the tokens before it in its own
    sequence; loss_mask is 0 on prompt tokens, environment tokens and padding.

    Attributes:
        input_ids_T: packed token ids.
        position_ids_T: position of each token inside its own sequence (restarts at 0 per sequence).
        loss_mask_T: 1.0 on tokens the loss trains on.
        advantages_T: each completion token's advantage (its sequence's, unless the advantage assigns
            credit per token).
        inference_logprobs_T: the engine's logprob of each token (0 where loss_mask is 0).
        seq_lens_N: length of each packed sequence; they sum to T.
        is_truncated_N: 1 for sequences whose completion hit max_tokens without a stop.
        expert_mask_T: 1.0 on the completion tokens of expert sequences (Rollout.is_expert), which
            loss_mask_T never covers; all zeros (the default) when the batch has none.
        prefix_tree: the packed row's trie, when the orchestrator packed by prefix-tree nodes or the
            trainer built it (it shares prefixes); built once and carried with the micro-batch.
        num_loss_tokens, num_expert_tokens, num_loss_seqs: counted once when the micro-batch is made
            (on the host, where it is packed or decoded), so the trainer's per-step sums need no device
            sync; derived from the masks, never passed in.
        vision: the image inputs of the row's sequences, concatenated in row order
            (grpokit.vision.inputs.concat); None when no sequence has images. The trainer then scores the
            row with the model's own positions (grpokit.vision.positions), never by prefix tree.
    """

    input_ids_T: torch.Tensor
    position_ids_T: torch.Tensor
    loss_mask_T: torch.Tensor
    advantages_T: torch.Tensor
    inference_logprobs_T: torch.Tensor
    seq_lens_N: torch.Tensor
    is_truncated_N: torch.Tensor
    expert_mask_T: torch.Tensor | None = None
    prefix_tree: PrefixTree | None = None
    vision: VisionInputs | None = None
    num_loss_tokens: int = field(init=False)
    num_expert_tokens: int = field(init=False)
    num_loss_seqs: int = field(init=False)

    def __post_init__(self) -> None:
        if self.expert_mask_T is None:
            self.expert_mask_T = torch.zeros_like(self.loss_mask_T)
        self.num_loss_tokens = int(self.loss_mask_T.sum().item())
        self.num_expert_tokens = int(self.expert_mask_T.sum().item())
        mask_T = self.loss_mask_T.float()
        per_seq_N = mask_T.new_zeros(len(self.seq_lens_N)).index_add(0, self.seq_ids_T().to(mask_T.device), mask_T)
        self.num_loss_seqs = int((per_seq_N > 0).sum().item())

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids_T.numel())

    def seq_ids_T(self) -> torch.Tensor:
        """Index of the sequence each token belongs to."""
        return torch.repeat_interleave(
            torch.arange(len(self.seq_lens_N), device=self.seq_lens_N.device), self.seq_lens_N
        )


@dataclass
class TrainingBatch:
    """Everything the trainer needs for one optimizer step.

    Attributes:
        step: the trainer step this batch is for.
        micro_batches: gradients of all micro-batches are accumulated into one optimizer step.
        temperature: sampling temperature the logprobs were taken at; the trainer scales its logits
            by the same value so the importance ratio compares like with like.
        metrics: orchestrator metrics for this step (reward mean/std, lengths, off-policy gap, ...).
    """

    step: int
    micro_batches: list[MicroBatch]
    temperature: float = 1.0
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def num_loss_tokens(self) -> int:
        return sum(mb.num_loss_tokens for mb in self.micro_batches)

    @property
    def num_expert_tokens(self) -> int:
        return sum(mb.num_expert_tokens for mb in self.micro_batches)

    @property
    def num_loss_seqs(self) -> int:
        """Sequences with at least one loss token."""
        return sum(mb.num_loss_seqs for mb in self.micro_batches)


@dataclass
class WeightUpdate:
    """The trainer's weights after a step, as the engine needs them.

    Attributes:
        step: the number of optimizer steps these weights have seen.
        tensors: LoRA adapter tensors (peft naming) when lora_config is set, else the full state dict.
        lora_config: the peft LoraConfig as a dict, or None for a full-weights update.
        path: the folder the update was read from, when a broadcast stores it on disk (engines that
            load weights themselves, such as vLLM's LoRA hot reload, read it there).
        norm_tensors: the engine's RMSNorm weights for this step, base-model names (QeRL noise,
            grpokit.common.noisy_norms): clean weights plus fresh noise; empty when no noise scheduler is on.
            The engine loads them after `tensors`, so they win over a full update's clean norms.
        in_engine: the broadcast has put the weights into the engine's own workers already (VLLMNCCLBroadcast):
            `tensors` is empty, and a LoRA update's `path` is a folder on the engine's machine.
        probe: the weight probe (grpokit.common.weight_probe) as the trainer published it with these
            weights, `{"token_ids", "logprobs"}`: what an engine that cannot show its tensors (vLLM) is
            checked against; None: not published.
    """

    step: int
    tensors: dict[str, torch.Tensor]
    lora_config: dict | None = None
    path: str | None = None
    norm_tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    in_engine: bool = False
    probe: dict[str, list] | None = None

    def wire_tensors(self) -> dict[str, torch.Tensor]:
        """`tensors` and `norm_tensors` in one dict (norms under NORMS_PREFIX), for broadcasts that send one list."""
        return {**self.tensors, **{NORMS_PREFIX + k: v for k, v in self.norm_tensors.items()}}

    @classmethod
    def from_wire(
        cls, step: int, wire: dict[str, torch.Tensor], lora_config: dict | None = None, path: str | None = None
    ) -> WeightUpdate:
        """The inverse of wire_tensors."""
        norms = {k[len(NORMS_PREFIX) :]: v for k, v in wire.items() if k.startswith(NORMS_PREFIX)}
        tensors = {k: v for k, v in wire.items() if not k.startswith(NORMS_PREFIX)}
        return cls(step=step, tensors=tensors, lora_config=lora_config, path=path, norm_tensors=norms)


NORMS_PREFIX = "noisy_norms/"  # "/" never occurs in a torch parameter name, so no clash with model tensors
