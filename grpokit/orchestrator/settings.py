"""RolloutSettings: the recipe's `data.*` rollout settings as plain, checked data.

The Orchestrator (the recipe's `data` section, a LightningDataModule) builds them from its keys
(RolloutSettings.from_recipe) and the RolloutLoop samples by them, so the producer can be built, and
tested, without a DataModule. Every check runs when they are built: a bad value stops the start before
anything loads, with a message naming its recipe key.

What the settings name but a tokenizer is needed to load (the environments, data.expert's source, the
filters' vocabulary) is RolloutInputs, loaded once by load_inputs before the engine loads the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from grpokit.advantage import Advantage
from grpokit.common.waits import check_seconds
from grpokit.environments.environment import Environment, EnvSpec, check_unique_names
from grpokit.filter import Filter
from grpokit.inference import SamplingSettings
from grpokit.judges import judged
from grpokit.judges.cache import JudgeCache
from grpokit.orchestrator.batching import BatchShape, check_group_size, resolve_batch_shape
from grpokit.orchestrator.buffer import BufferSettings
from grpokit.orchestrator.evaluation import EvalSettings
from grpokit.orchestrator.experts import DatasetExperts, ExpertSettings, ReferenceExperts, expert_source
from grpokit.orchestrator.kl_reward import KLInRewardSettings
from grpokit.orchestrator.schedules import TemperatureSchedule
from grpokit.orchestrator.streaming import StreamingSettings
from grpokit.registry.advantages.group_norm import GroupNorm
from grpokit.vision.images import PixelBudget


def _default_env() -> list[EnvSpec]:
    return [EnvSpec(id="reverse-text")]


@dataclass
class RolloutSettings:
    """Every rollout setting of a recipe's `data` section, resolved (the batch shape from its ms-swift/TRL
    aliases, nulls filled) and checked. The keys mean what grpokit.orchestrator.Orchestrator's docstring
    says; the defaults are its. `env_specs` is `data.env`, `eval_settings` is `data.eval`; `seed` is
    filled (0 when null), and `sampling.seed` from it when null."""

    shape: BatchShape = field(default_factory=lambda: BatchShape(32, 8, 1, 1))
    env_specs: list[EnvSpec] = field(default_factory=_default_env)
    advantage: Advantage = field(default_factory=GroupNorm)
    filters: list[Filter] = field(default_factory=list)
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    temp_scheduler: TemperatureSchedule | None = None
    seq_len: int = 2048
    max_prompt_tokens: int | None = None
    packing: Literal["auto", "tokens", "prefix_tree"] = "auto"
    max_async_level: int = 1
    deterministic: bool = True
    max_off_policy_steps: int = 8
    seed: int = 0
    buffer: BufferSettings = field(default_factory=BufferSettings)
    eval_settings: EvalSettings | None = None
    num_logged_samples: int = 4
    timeout: float = 1800.0
    weights_timeout: float | None = None
    expert: ExpertSettings | None = None
    kl_in_reward: KLInRewardSettings | None = None
    max_turns: int = 8
    streaming: StreamingSettings | None = None
    pixel_budget: PixelBudget | None = None

    def __post_init__(self) -> None:
        """Check the settings together, in the order a start reports them; fill sampling.seed."""
        _check_staleness(self.max_async_level, self.max_off_policy_steps)
        check_group_size(self.advantage, self.shape.rollouts_per_example)
        _check_kl_in_reward(self.kl_in_reward, self.advantage)
        check_unique_names(self.env_specs, "data.env")
        if self.eval_settings is not None and self.eval_settings.env is not None:
            check_unique_names(self.eval_settings.env, "data.eval.env")
        if self.num_logged_samples < 0:
            raise ValueError(f"data.num_logged_samples must be >= 0 (0 logs none), got {self.num_logged_samples}")
        if self.sampling.seed is None:
            self.sampling = replace(self.sampling, seed=self.seed)
        _check_temperature(self.sampling, self.temp_scheduler, self.streaming)
        check_seconds("data.timeout", self.timeout)
        check_seconds("data.weights_timeout", self.weights_timeout, none_ok=True)
        if self.max_turns < 1:
            raise ValueError(f"data.max_turns must be >= 1 (assistant turns per rollout), got {self.max_turns}")

    @classmethod
    def from_recipe(
        cls,
        env: list[EnvSpec] | None = None,
        batch_size: int | None = None,
        rollouts_per_example: int | None = None,
        advantage: Advantage | None = None,
        filters: list[Filter] | None = None,
        sampling: SamplingSettings | None = None,
        seed: int | None = None,
        buffer: BufferSettings | None = None,
        eval: EvalSettings | None = None,
        generation_batch_size: int | None = None,
        steps_per_generation: int | None = None,
        num_generations: int | None = None,
        num_iterations: int = 1,
        **settings,
    ) -> RolloutSettings:
        """The settings of the recipe keys `data.*` as the Orchestrator takes them (all but `transport`):
        the batch shape resolved from batch_size, rollouts_per_example and their aliases
        (grpokit.orchestrator.batching), null where a key has a default taken as that default; the other
        keys (`settings`) are fields as they are."""
        shape = resolve_batch_shape(
            batch_size,
            rollouts_per_example,
            generation_batch_size,
            steps_per_generation,
            num_generations,
            num_iterations,
        )
        nullable = {"env_specs": env or None, "advantage": advantage, "sampling": sampling, "buffer": buffer}
        given = {key: value for key, value in nullable.items() if value is not None}
        seed = 0 if seed is None else seed  # the CLI fills null from seed_everything; 0 when built directly
        return cls(shape=shape, filters=list(filters or []), seed=seed, eval_settings=eval, **given, **settings)

    @property
    def batch_size(self) -> int:
        """Rollouts per optimizer step."""
        return self.shape.batch_size

    @property
    def rollouts_per_example(self) -> int:
        """Completions sampled per prompt (the group size G)."""
        return self.shape.rollouts_per_example


def _check_staleness(max_async_level: int, max_off_policy_steps: int) -> None:
    if max_async_level < 0:
        raise ValueError(f"data.max_async_level must be >= 0, got {max_async_level}")
    if max_off_policy_steps < max_async_level:
        raise ValueError(
            f"data.max_off_policy_steps ({max_off_policy_steps}) must be >= "
            f"data.max_async_level ({max_async_level}): every batch may be that stale"
        )


def _check_kl_in_reward(kl_in_reward: KLInRewardSettings | None, advantage: Advantage) -> None:
    if kl_in_reward is not None and not advantage.uses_outcome_reward:
        raise ValueError(
            f"data.kl_in_reward shapes each rollout's reward, which data.advantage {type(advantage).__name__} "
            "does not read (it uses step rewards only): set data.kl_in_reward: null or another data.advantage"
        )


def _check_temperature(
    sampling: SamplingSettings, temp_scheduler: TemperatureSchedule | None, streaming: StreamingSettings | None
) -> None:
    if temp_scheduler is not None and sampling.temperature is not None:
        raise ValueError(
            "set either data.sampling.temperature or data.temp_scheduler, "
            "not both (the schedule sets the temperature of each step)"
        )
    if streaming is not None and temp_scheduler is not None:
        raise ValueError(
            "data.streaming and data.temp_scheduler cannot be combined (a stream samples at one "
            "temperature); set one of them to null"
        )


@dataclass
class RolloutInputs:
    """What the settings name, loaded with the policy's tokenizer: the training environments, the eval
    environments (data.eval.env; None: eval draws from the training ones) and data.expert's source."""

    training: list[Environment]
    evaluation: list[Environment] | None
    experts: ReferenceExperts | DatasetExperts | None = None


def load_inputs(settings: RolloutSettings, tokenizer) -> RolloutInputs:
    """Load the training and eval environments and data.expert's source (an SFT dataset read and
    rendered), and give the filters the policy's tokenizer. Call it once a run (the filters learn the
    vocabulary; grpokit.orchestrator.Orchestrator.prepare keeps what it returns), before the engine loads
    the model, so a bad dataset or filter setting stops the start in seconds, as one line naming it.
    An environment with a `judge` gets its judge reward (grpokit.judges; the judges share one cache)."""
    cache, merge = JudgeCache(), not settings.deterministic  # merged judge batches depend on timing
    training = [judged(Environment(spec), cache, merge) for spec in settings.env_specs]
    evaluation = None
    if settings.eval_settings is not None and settings.eval_settings.env:
        evaluation = [judged(Environment(spec), cache, merge) for spec in settings.eval_settings.env]
    for f in settings.filters:
        f.connect(tokenizer)
    experts = None
    if settings.expert is not None:
        experts = expert_source(settings.expert, training, tokenizer, settings.seq_len, settings.seed)
    return RolloutInputs(training, evaluation, experts)
