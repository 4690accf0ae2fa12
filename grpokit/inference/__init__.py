"""The `inference` kind: an engine that samples completions with per-token logprobs.

The builtin torch engine runs anywhere; vLLM replaces it for scale. The orchestrator only uses this
interface, so swapping engines is one recipe line.
"""

from __future__ import annotations

import math
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

from grpokit.inference.finish import FINISH_REASONS, server_finish_reason  # noqa: F401 (engines import them here)
from grpokit.types import WeightUpdate

# Logits are divided by the temperature and (for repeated tokens) scaled by the penalty in float32: a
# temperature of 1e-45 or a penalty of 1e300 overflows them to inf and the sampler's softmax to NaN. vLLM
# raises a temperature below 0.01 to 0.01 for the same reason; grpokit refuses it, naming the key.
MIN_TEMPERATURE = 0.01
MAX_REPETITION_PENALTY = 100.0


def temperature_ok(value: float) -> bool:
    """0 (greedy) or a finite temperature >= MIN_TEMPERATURE."""
    return value == 0 or (math.isfinite(value) and value >= MIN_TEMPERATURE)


def repetition_penalty_ok(value: float) -> bool:
    """A penalty in (0, MAX_REPETITION_PENALTY] (1 = off)."""
    return 0 < value <= MAX_REPETITION_PENALTY


@dataclass
class SamplingSettings:
    """How completions are sampled.

    Args:
        temperature: softmax temperature (0 = greedy; null = 1.0, or data.temp_scheduler's value). Logprobs
            are of the temperature-scaled distribution, before top-p truncation, and the trainer scales its
            logits the same way.
        top_p: nucleus sampling mass.
        max_tokens: completion length cap; a completion that reaches it without a stop is truncated.
        stop: strings that end a completion (the stop string is kept in the completion).
        seed: seed of the sampler; the orchestrator derives each step's seed from it and the step. null =
            data.seed (itself seed_everything unless set), so a seed sweep varies the rollouts.
        min_tokens: stop tokens (EOS) are masked, and stop strings ignored, until a completion has this
            many tokens (vLLM's min_tokens). Logprobs are of the masked distribution.
        repetition_penalty: CTRL's penalty on tokens already in the prompt or completion (> 1 discourages
            repeats; 1 = off), as HF and vLLM define it. Logprobs are of the penalized distribution, which
            the trainer does not reproduce: the loss's importance ratio sees the penalty as off-policy-ness
            (docs/orchestrator.md measures it).
        stop_token_ids: token ids that end a completion as the model's EOS does (vLLM's stop_token_ids: a
            chat template's end-of-turn token that is not EOS, Qwen's `<|im_end|>` and `<|endoftext|>`);
            the token is kept in the completion, and min_tokens masks these too.
    """

    temperature: float | None = None
    top_p: float = 1.0
    max_tokens: int = 64
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    min_tokens: int = 0
    repetition_penalty: float = 1.0
    stop_token_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.temperature is not None and not temperature_ok(self.temperature):
            raise ValueError(
                f"data.sampling.temperature must be 0 (greedy) or a finite number >= {MIN_TEMPERATURE:g}, got "
                f"{self.temperature} (a smaller one overflows the logits)"
            )
        if not 0 < self.top_p <= 1:
            raise ValueError(f"data.sampling.top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise ValueError(f"data.sampling.max_tokens must be >= 1, got {self.max_tokens}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(
                f"data.sampling.stop must be non-empty strings, got {self.stop!r}: an empty stop string "
                "matches at once and every completion would end after one token"
            )
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(
                f"data.sampling.min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}"
            )
        if not repetition_penalty_ok(self.repetition_penalty):
            raise ValueError(
                f"data.sampling.repetition_penalty must be in (0, {MAX_REPETITION_PENALTY:g}] (1 = off, "
                f"> 1 discourages repeats), got {self.repetition_penalty}"
            )
        if any(type(t) is not int or t < 0 for t in self.stop_token_ids):
            raise ValueError(
                f"data.sampling.stop_token_ids must be token ids (integers >= 0), got {self.stop_token_ids!r}"
            )


@dataclass
class Completion:
    """One sampled completion: token ids, their logprobs, and why it ended (`finish_reason`).

    `top_logprobs`: per token, the k most likely (token id, logprob) pairs of the distribution its logprob
    is of, most likely first; None unless a server's request asked for them (ServingOptions.top_logprobs).
    `token_steps`: per token, the weight step whose weights produced it, when a streaming engine loaded
    new weights while the completion was being decoded (grpokit.inference.streams); None when one step
    sampled it all (`policy_step`). `policy_step` is always the oldest token's step.
    `finish_reason`: one of FINISH_REASONS; None derives it from `is_truncated` ("length" or "stop"), so
    an engine that only knows stop from max_tokens records both. `is_truncated` is then `finish_reason ==
    "length"`: an aborted completion is not truncated, and not a natural stop either.
    """

    token_ids: list[int]
    logprobs: list[float]
    is_truncated: bool
    policy_step: int
    top_logprobs: list[list[tuple[int, float]]] | None = None
    token_steps: list[int] | None = None
    finish_reason: str | None = None

    def __post_init__(self) -> None:
        if self.finish_reason is None:
            self.finish_reason = "length" if self.is_truncated else "stop"
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"finish_reason must be one of {FINISH_REASONS}, got {self.finish_reason!r}")
        self.is_truncated = self.finish_reason == "length"

    @classmethod
    def aborted(cls, policy_step: int) -> Completion:
        """The empty completion of a request cancelled before it was decoded: "abort", not a stop."""
        return cls([], [], False, policy_step, finish_reason="abort")

    @classmethod
    def from_steps(
        cls,
        token_ids: list[int],
        logprobs: list[float],
        is_truncated: bool,
        steps: list[int],
        finish_reason: str | None = None,
    ) -> Completion:
        """A streamed completion whose token i came from weight step steps[i]: policy_step is the oldest
        token's, and token_steps is kept only when the steps differ."""
        mixed = len(set(steps)) > 1
        token_steps = list(steps) if mixed else None
        return cls(token_ids, logprobs, is_truncated, min(steps), token_steps=token_steps, finish_reason=finish_reason)


@dataclass
class NewTokens:
    """Tokens one completion gained in a decode step (or a few), handed to ServingOptions.on_tokens.

    `index` is the completion's place in generate's flat order: prompt i's j-th completion is i * n + j.
    """

    index: int
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]] | None = None


@dataclass
class ServingOptions:
    """What one server request adds to `generate`, for engines with `takes_serving_options`.

    Args:
        top_logprobs: also report, per token, the k most likely tokens of the very distribution the token's
            logprob is of (temperature-scaled, before top-p; Completion.top_logprobs). 0 = none, and no
            cost. Only engines with `reports_top_logprobs`.
        on_tokens: called from the decode loop, on the engine's thread, with the tokens each step added
            (a streaming answer); the engine's own work waits while it runs, so it should be quick.
        cancelled: set (from any thread) when the request's client has gone: the engine stops the
            request between decode steps, and what generate returns then is incomplete.
    """

    top_logprobs: int = 0
    on_tokens: Callable[[list[NewTokens]], None] | None = None
    cancelled: threading.Event | None = None

    def is_cancelled(self) -> bool:
        return self.cancelled is not None and self.cancelled.is_set()


class InferenceEngine(ABC):
    """Contract: after `setup(model)`, `generate(prompts, n, sampling)` returns n completions per prompt
    (outer list in prompt order) and `load_weights(update)` switches to the update's weights; every
    Completion records the `policy_step` of the weights that sampled it.

    `applies_norm_weights`: the engine loads `update.norm_tensors` (QeRL's noisy RMSNorm weights) with
    each update; a recipe with a noise scheduler refuses an engine that does not (checked at start).

    `servers_load_weights`: the engine is a client of servers (listed in `base_urls`) that load each
    update from the broadcast themselves (RemoteEngine in front of `grpokit infer`): `load_weights` only
    records the step, and `served_weight_step()` asks the servers which step they hold.

    `later_turn_images`: a conversation whose environment's later turn brought images (its image inputs
    grown by them, grpokit.environments.image_turns) can be sampled with them (BuiltinEngine's plain path,
    RemoteEngine in front of `grpokit infer`, VLLMEngine with the conversation's grown ImageSource); others
    (BuiltinEngine's fast path) are refused at such a turn, naming the example.

    `takes_serving_options`: `generate` also takes `options=ServingOptions(...)` (a server's request:
    tokens as they are decoded, cancellation); `reports_top_logprobs`: it honours options.top_logprobs.
    grpokit's server adapts engines without them (grpokit.inference.server.http: the tokens all at the
    end, no cancellation, top logprobs refused with a 400).
    """

    weight_step: int = -1
    applies_norm_weights: bool = False
    servers_load_weights: bool = False
    later_turn_images: bool = False
    takes_serving_options: bool = False
    reports_top_logprobs: bool = False

    @abstractmethod
    def setup(self, model: str) -> None:
        """Load the base model (alias, HF id or path) and its tokenizer."""

    @abstractmethod
    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingSettings) -> list[list[Completion]]:
        """Sample n completions for each prompt (token ids, chat template already applied)."""

    @abstractmethod
    def load_weights(self, update: WeightUpdate) -> None:
        """Switch to the weights of `update` (a LoRA adapter or a full state dict)."""

    def open_stream(
        self, sampling: SamplingSettings, max_rows: int, on_update: str = "continue", max_len: int | None = None
    ):
        """A GenerationStream (grpokit.inference.streams): groups submitted while others decode, finished
        groups returned as they finish, weights loaded between decode steps. `max_rows`: rows decoding
        at once; `on_update`: continue or regenerate unfinished rows after an update (servers: or finish
        them on the weights they began with); `max_len`: the
        longest prompt + completion that will be sent (engines with static caches size them by it).
        This default runs each advance's queued groups as one `generate` (whole batches, weights between
        them); engines that decode incrementally override it."""
        from grpokit.inference.streams import BatchedStream

        return BatchedStream(self, sampling, max_rows)

    def context_length(self) -> int | None:
        """The longest prompt + completion the engine samples (its model's positions, or a configured
        max_model_len); None when it cannot say. The orchestrator checks max_tokens and prompts against it."""
        return None

    def served_weight_step(self, upto: int | None = None) -> int:
        """The step of the weights the engine's servers hold, each after loading the newest published
        one (up to step `upto`, when given: data.deterministic) (engines with `servers_load_weights`)."""
        raise NotImplementedError(f"{type(self).__name__} has no servers that load weights themselves")

    def weights_sha256(self) -> str:
        """grpokit.common.checksums.tensors_sha256 of the weights the engine samples with, as the trainer's
        `weight_update` names them (the LoRA adapter, or the full state dict): equal to the trainer's
        sha256 when the engine holds exactly the published weights. Optional; the server's
        `GET /v1/weights?sha256=true` reports it."""
        raise NotImplementedError(f"{type(self).__name__} cannot checksum its weights")

    def loaded_tensors(self, update: WeightUpdate) -> dict | None:
        """The engine's weights under the names `update` uses (its `tensors`, and its `norm_tensors`' base-model
        names), live, not copied: grpokit.common.loaded_weights compares them with the update after every load.
        None (this default): the engine cannot show them (vLLM, remote servers), and is not checked."""
        return None

    def close(self) -> None:
        """Free the model and any server."""
