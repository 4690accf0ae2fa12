"""The hook that adds a judge reward to an environment's rewards: `data.env[i].judge` in a recipe.

    data:
      env:
        - id: reverse-text
          judge: {kind: builtin, model: HuggingFaceTB/SmolLM2-135M-Instruct, weight: 0.5,
                  rubric: "The reply is the prompt's text reversed, nothing else.", on_failure: score}

`judge` may be a list of such settings (each with its own `name`): every judge's weighted score is added.

A JudgedEnvironment is the environment with `checked_scores` extended: every scoring path of an
environment (a single-turn group, a multi-turn group's conversations, a verifiers Env episode's traces)
ends there with the group's verifiers traces, so the judge sees each rollout's whole conversation as the
trace lists it, and one call is one group: its conversations go to the judge as one batch. The reward is
the rubric's plus `weight` x the judge's [0, 1] score (the classifier's raw scalar), checked against
MAX_ABS_REWARD like any reward. Per-rollout metrics (env/ in metrics.csv, means over the step):
`reward/<name>` the judge's score, `judge/<name>/parse_failures`, `.../timeouts`, `.../down`,
`.../dropped` (0 or 1 each), `.../seconds` (the group's judge batch time, cache hits included); the
judge's reply (a classifier's score) is the rollout's note `judge/<name>/reply` in samples.jsonl.
"""

from __future__ import annotations

from pathlib import Path

from grpokit.common.errors import RunDataError
from grpokit.environments.environment import REWARD_METRIC_PREFIX, Environment, is_moderate
from grpokit.judges.cache import JudgeCache
from grpokit.judges.deferred import Deferred, deferred_here
from grpokit.judges.reward import Judged, JudgeReward, JudgeSettings

FAILURE_METRICS = {"parse": "parse_failures", "timeout": "timeouts", "down": "down", "nonfinite": "nonfinite"}


class JudgedEnvironment(Environment):
    """An environment whose rewards include its judges': the loaded environment's examples and rubric,
    shared (not reloaded), with each judge of `judges` added in `checked_scores`."""

    def __init__(self, env: Environment, judges: list[JudgeReward]) -> None:
        self.__dict__.update(env.__dict__)
        self.judges = judges

    def checked_scores(self, examples: list, traces: list, outcomes: list, *args, **kwargs) -> list:
        scored = super().checked_scores(examples, traces, outcomes, *args, **kwargs)
        conversations = [[m.model_dump(exclude_none=True) for m in tr.messages] for tr in traces]
        labels = [f"example {ex.index}" for ex in examples]
        deferred = deferred_here()
        if deferred is not None and all(j.settings.concurrent for j in self.judges):  # the loop goes on meanwhile
            futures = [j.queue.submit(conversations, labels) for j in self.judges]
            deferred.append(Deferred(futures, lambda judged: self.with_judges(scored, judged, examples), len(scored)))
            return scored  # the rubric's part; grpokit.judges.deferred.complete puts the judges' in
        return self.with_judges(scored, [j.judge(conversations, labels) for j in self.judges], examples)

    def with_judges(self, scored: list, judged: list[list[Judged]], examples: list) -> list[tuple[float, dict]]:
        """The group's (reward, metrics): the rubric's plus each judge's weighted score, after each judge's
        failure policy (one judge dropping the group drops it: every reward 0)."""
        labels = [f"example {ex.index}" for ex in examples]
        totals = [reward for reward, _ in scored]
        metrics = [dict(m) for _, m in scored]
        settled = [judge.settle(js, labels, self.name) for judge, js in zip(self.judges, judged)]
        dropped = any(d for _, d in settled)
        for judge, js, (rewards, _) in zip(self.judges, judged, settled):
            for i, (judge_reward, j) in enumerate(zip(rewards, js)):
                totals[i] += judge.settings.weight * judge_reward
                metrics[i].update(judge_metrics(judge.settings.name, judge_reward, j, dropped))
        for total, ex in zip(totals, examples):
            if not dropped and not is_moderate(total):
                names = [j.settings.name for j in self.judges]
                raise RunDataError(
                    f"environment {self.name!r} example {ex.index}: reward with judges {names} is {total!r}; "
                    "scale the judges down (judge.weight)"
                )
        return [(0.0 if dropped else total, m) for total, m in zip(totals, metrics)]


def judge_metrics(name: str, score: float, judged: Judged, dropped: bool) -> dict[str, float | str]:
    """One rollout's judge metrics (see the module docstring), and the judge's reply (a classifier's score,
    or the failure's error) as the str `judge/<name>/reply`, which the Rollout keeps as a note."""
    prefix = f"judge/{name}/"
    metrics: dict[str, float | str] = {f"{prefix}{m}": float(judged.failure == k) for k, m in FAILURE_METRICS.items()}
    metrics[f"{prefix}dropped"] = float(dropped)
    metrics[f"{prefix}seconds"] = judged.seconds
    metrics[f"{REWARD_METRIC_PREFIX}{name}"] = score
    metrics[f"{prefix}reply"] = judged.reply  # a str: the rollout's note for samples.jsonl (grpokit.types.Rollout)
    return metrics


def dropped_by_judge(rollouts: list) -> bool:
    """Whether a judge's failure dropped this group (`on_failure: drop_group`): the rollout loop leaves it
    out of the batch, as the buffer rules leave out a filtered group (prompts.jsonl: `judge_failed`)."""
    return any(
        value == 1.0 and key.startswith("judge/") and key.endswith("/dropped")
        for r in rollouts
        for key, value in r.metrics.items()
    )


def judged(env: Environment, cache: JudgeCache | None = None, merge: bool = False) -> Environment:
    """`env` with the judges its spec names (`judge`: one judge's settings, or a list of them with distinct
    names), or `env` itself when it names none. The judges' models load at their first batch, so a bad
    setting fails here, at start, and a model only when used. `merge`: a judge's thread asks several
    groups' batches as one (grpokit.judges.queue; not in deterministic runs)."""
    value = getattr(env.spec, "judge", None)
    if value is None:
        return env
    where = f"data.env {env.spec.id!r}"
    values = value if isinstance(value, list) else [value]
    if not values:
        raise ValueError(f"{where}: judge is an empty list; give one judge's settings, a list of them, or null")
    settings = [JudgeSettings.from_recipe(v, where) for v in values]
    names = [s.name for s in settings]
    if len(set(names)) < len(names):
        raise ValueError(f"{where}: judges {names} share a name; give each its own `name` (their metrics' name)")
    return JudgedEnvironment(env, [JudgeReward(s, cache, merge) for s in settings])


def attach_run(envs: list[Environment], run_dir: str | Path) -> None:
    """Keep the judges' replies of `envs` in the run folder (grpokit.judges.cache), reading what an
    earlier attempt of the run stored, so that a resumed run scores as the uninterrupted one did."""
    for env in envs:
        for judge in getattr(env, "judges", ()):
            if judge.cache.path is None:
                judge.cache.attach(run_dir)
