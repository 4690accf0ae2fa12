"""Online evaluation: score the engine's current weights on a fixed set of prompts every few steps.

Eval runs in the orchestrator, on the weights the engine has loaded, before it samples the next training
batch; its metrics (`eval/reward`, `eval/<env metric>`, `eval/weight_step`, and with rollouts_per_example
n > 1 `eval/pass@k` for k = 1, 2, 4, ... and n: grpokit.orchestrator.eval_metrics) are logged with that
batch and appended to `{run_dir}/eval.jsonl`. `grpokit eval` (grpokit.evaluate) samples the same prompts
the same way after training.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from grpokit.environments.environment import Environment, EnvSpec
from grpokit.inference import InferenceEngine, SamplingSettings
from grpokit.orchestrator.eval_metrics import pass_at_k_means
from grpokit.orchestrator.group_play import generate_rollouts
from grpokit.orchestrator.prompts import PromptSampler
from grpokit.orchestrator.rollouts import TurnLimits
from grpokit.types import Rollout


@dataclass
class EvalSettings:
    """Online evaluation.

    Args:
        env: environments to evaluate on (default: the training environments).
        num_examples: prompts per evaluation (a fixed, seeded selection); -1 = every example of the
            eval environments.
        rollouts_per_example: completions per prompt; above 1, pass@k is logged too (`eval/pass@k`, k = 1,
            2, 4, ... and rollouts_per_example; use temperature > 0, or the samples are all the same).
        interval: evaluate the weights of every interval-th step (>= 1; `data.eval: null` turns eval off).
        eval_base_model: also evaluate the initial weights (step 0).
        temperature: sampling temperature of eval (0 = greedy).
        max_tokens: completion cap (default: the training sampling's max_tokens).
        seed: seed of the prompt selection and sampling.
        skip_eval_on_resume: a resumed run does not evaluate the weights it resumes with (they were
            evaluated before the stop, or are not due); its next eval is at the next multiple of interval.
        pass_threshold: a completion with reward >= this counts as correct for pass@k (1.0: full reward).
    """

    env: list[EnvSpec] | None = None
    num_examples: int = 16
    rollouts_per_example: int = 1
    interval: int = 10
    eval_base_model: bool = True
    temperature: float = 0.0
    max_tokens: int | None = None
    seed: int = 1234
    skip_eval_on_resume: bool = False
    pass_threshold: float = 1.0

    def __post_init__(self) -> None:
        if self.interval < 1:
            raise ValueError(
                f"data.eval.interval must be >= 1, got {self.interval}; set data.eval: null to turn evaluation off"
            )
        if self.num_examples < 1 and self.num_examples != -1:
            raise ValueError(f"data.eval.num_examples must be >= 1, or -1 for every example, got {self.num_examples}")
        if self.rollouts_per_example < 1:
            raise ValueError(f"data.eval.rollouts_per_example must be >= 1, got {self.rollouts_per_example}")

    def due(self, weight_step: int, last_evaluated: int | None) -> bool:
        """Whether the weights of `weight_step` should be evaluated now: the first weights at or past the
        next multiple of interval (the engine may skip a step when the trainer is ahead)."""
        if last_evaluated is None:
            target = 0 if self.eval_base_model else self.interval
        else:
            target = (last_evaluated // self.interval + 1) * self.interval
        return weight_step >= target


class Evaluator:
    """Holds the eval environments and prompts; `run()` returns eval metrics for the engine's weights."""

    def __init__(
        self,
        settings: EvalSettings,
        envs: list[Environment],
        sampling: SamplingSettings,
        run_dir: Path,
        start_step: int = 0,
        turns: TurnLimits | None = None,
        images=None,
    ) -> None:
        self.settings, self.run_dir, self.turns = settings, Path(run_dir), turns
        sampler = PromptSampler(envs, settings.seed)
        self.prompts = sampler.next(len(sampler.pools[0]) if settings.num_examples == -1 else settings.num_examples)
        # prompts with images (images: ImagePrompts) are rendered once; one with a bad image is logged, left out
        self.prompt_ids, self.vision = None, {}
        if images is not None:
            self.prompts, self.prompt_ids, self.vision = images.render_all(self.prompts)
        self.sampling = replace(
            sampling,
            temperature=settings.temperature,
            seed=settings.seed,
            max_tokens=settings.max_tokens or sampling.max_tokens,
        )
        # a resumed run with skip_eval_on_resume counts its resume step as evaluated
        self.last_evaluated: int | None = start_step if start_step and settings.skip_eval_on_resume else None

    def sample(self, engine: InferenceEngine, tokenizer) -> list[list[Rollout]]:
        """One scored group of rollouts_per_example rollouts per prompt, in prompt order, sampled with the
        engine's current weights through the rollout path of training (any engine, any environment)."""
        return generate_rollouts(
            engine,
            tokenizer,
            self.prompts,
            self.settings.rollouts_per_example,
            self.sampling,
            0,
            self.prompt_ids,
            self.turns,
            self.vision,
        )

    def maybe_run(self, engine: InferenceEngine, tokenizer) -> dict[str, float]:
        if not self.settings.due(engine.weight_step, self.last_evaluated):
            return {}
        groups = self.sample(engine, tokenizer)
        rollouts = [r for g in groups for r in g]
        metrics = {
            "eval/reward": sum(r.reward for r in rollouts) / len(rollouts),
            "eval/seq_len": sum(len(r.completion_ids) for r in rollouts) / len(rollouts),
            "eval/weight_step": float(engine.weight_step),
        }
        for key in sorted({k for r in rollouts for k in r.metrics}):
            metrics[f"eval/{key}"] = sum(r.metrics.get(key, 0.0) for r in rollouts) / len(rollouts)
        if self.settings.rollouts_per_example > 1:
            rewards = [[r.reward for r in g] for g in groups]
            metrics.update(
                (f"eval/pass@{k}", v) for k, v in pass_at_k_means(rewards, self.settings.pass_threshold).items()
            )
        self.last_evaluated = engine.weight_step
        with open(self.run_dir / "eval.jsonl", "a") as f:
            f.write(json.dumps(metrics) + "\n")
        return metrics
