"""One model on the eval problems: k samples per problem (and a greedy one), then per-environment metrics.

Sampling is the online evaluator's (grpokit.orchestrator.evaluation.Evaluator: the same seeded problem
selection and sampling settings) through `generate_rollouts`, the rollout path of training, so any
engine and any environment (tools, multi-turn, verifiers Env episodes) works. The problems are played in
chunks of `chunk` problems (one stream each, chunk i seeded with seed + i) so the progress bar moves; with
every problem in one chunk the samples are exactly the online eval's.

Per environment, each metric is a mean over problems of a per-problem value, so each gets a bootstrap
interval over problems (grpokit.orchestrator.eval_metrics):
- `mean@n`: the problem's mean reward over its n samples;
- `pass@k` for each k asked: Chen et al.'s unbiased estimate from the problem's c correct of n;
- `maj@n`: whether its majority answer is correct (only where the tasks have `parse_answer`);
- `greedy`: the reward of its greedy (temperature 0) completion;
- `env/<name>`: the environment's own metric, the mean over the n samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from tqdm import tqdm

from grpokit.orchestrator.eval_metrics import bootstrap_ci, majority_correct, parse_answers, pass_at_k
from grpokit.orchestrator.evaluation import Evaluator
from grpokit.orchestrator.group_play import generate_rollouts
from grpokit.types import Rollout


@dataclass
class Problem:
    """One problem's samples: rewards, parsed answers (None: the task parses none), the greedy reward,
    and the environment's metrics averaged over the samples."""

    env: str
    example: int
    rewards: list[float]
    answers: list | None
    greedy_reward: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)

    def as_json(self) -> dict:
        answers = None if self.answers is None else [None if a is None else str(a) for a in self.answers]
        return {**self.__dict__, "answers": answers}


def sample_groups(evaluator: Evaluator, engine, tokenizer, sampling, n: int, chunk: int, label: str):
    """n scored rollouts per problem of `evaluator.prompts`, in problem order, chunk by chunk."""
    prompts, groups = evaluator.prompts, []
    with tqdm(total=len(prompts), desc=label, unit="problem", disable=None) as bar:
        for i, start in enumerate(range(0, len(prompts), chunk)):
            part = prompts[start : start + chunk]
            seeded = replace(sampling, seed=sampling.seed + i)
            ids = evaluator.prompt_ids[start : start + chunk] if evaluator.prompt_ids is not None else None
            groups += generate_rollouts(
                engine, tokenizer, part, n, seeded, start, ids, evaluator.turns, evaluator.vision
            )
            bar.update(len(part))
    return groups


def final_reply(rollout: Rollout) -> str:
    """The reply a parsed answer is read from, as reward functions read it (verifiers' `trace.last_reply`:
    stripped): the completion, or a multi-turn rollout's last assistant message."""
    replies = [m.get("content") or "" for m in rollout.messages or [] if m.get("role") == "assistant"]
    return (replies[-1] if replies else rollout.completion_text).strip()


def problems_of(evaluator: Evaluator, groups: list[list[Rollout]], greedy: list[list[Rollout]] | None):
    """A Problem per prompt from its sampled group and (optionally) its greedy group."""
    out = []
    for g, ((env, ex), group) in enumerate(zip(evaluator.prompts, groups)):
        keys = sorted({k for r in group for k in r.metrics})
        out.append(
            Problem(
                env=env.name,
                example=ex.index,
                rewards=[r.reward for r in group],
                answers=parse_answers(ex.task, [final_reply(r) for r in group]),
                greedy_reward=None if greedy is None else greedy[g][0].reward,
                metrics={k: sum(r.metrics.get(k, 0.0) for r in group) / len(group) for k in keys},
            )
        )
    return out


def per_problem_values(problems: list[Problem], ks: list[int], threshold: float) -> dict[str, dict[str, list]]:
    """{env: {metric: one value per problem of that env, in problem order}}."""
    out: dict[str, dict[str, list]] = {}
    for p in problems:
        n = len(p.rewards)
        c = sum(r >= threshold for r in p.rewards)
        values = {f"mean@{n}": sum(p.rewards) / n, **{f"pass@{k}": pass_at_k(n, c, k) for k in ks}}
        if p.answers is not None:
            values[f"maj@{n}"] = majority_correct(p.answers, p.rewards, threshold)
        if p.greedy_reward is not None:
            values["greedy"] = p.greedy_reward
        values.update((f"env/{k}", v) for k, v in p.metrics.items())
        env = out.setdefault(p.env, {})
        for name, value in values.items():
            env.setdefault(name, []).append(value)
    return out


def summarise(values: dict[str, dict[str, list]], seed: int, resamples: int, level: float) -> dict:
    """{env: {metric: {mean, ci_low, ci_high}}}; a metric some problems of an env lack (maj@n where
    only some tasks parse answers, an env metric reported by some rollouts) is left out for that env."""
    out = {}
    for env, metrics in values.items():
        count = max(len(v) for v in metrics.values())
        out[env] = {"problems": count, "metrics": {}}
        for name, vs in metrics.items():
            if len(vs) != count:
                continue
            low, high = bootstrap_ci(vs, seed, resamples, level)
            out[env]["metrics"][name] = {"mean": sum(vs) / len(vs), "ci_low": low, "ci_high": high}
    return out
