"""Environments: verifiers (v1) tasksets, seen the way the orchestrator needs them.

grpokit generates completions with its own engine and asks the taskset's task to score them
(`await task.score(trace)`), so no verifiers harness, sandbox or network is involved: verifiers' own
rollout path runs an agent program that it installs with `uv` from PyPI, which cannot work offline and
returns no token ids on its chat client (see docs/architecture.md).

An env id `reverse-text` is looked up as the built-in module `grpokit.envs.reverse_text`, then through
verifiers' loader (an installed module `reverse_text` or `verifiers.v1.tasksets.reverse_text`).

Step rewards (process supervision, for the `Process` advantage): a task that defines a method
`step_rewards(self, reply: str) -> list[tuple[int, float]]` reports the reply's reasoning steps as
(end, reward) pairs, `end` the character offset in the reply just past the step's last character
(ascending, 1..len(reply)). The orchestrator maps each end to the completion token that reaches it.
Tasks without the method report none (Rollout.step_rewards is None).

With two or more reward functions, each one's own score is a metric too, `reward/<function>`
(env/reward/<function> in metrics.csv, a mean over the step's rollouts like every env/ metric), next to
the weighted sum that is the reward.

A reward (and a step reward) must be a number, finite, with |reward| <= MAX_ABS_REWARD = 1e6; anything
else stops the run with an error naming the environment and example. verifiers casts a reward with
float(), so a str "0.5" or a bool True (a check's result returned instead of its score) would train
silently; they are refused where the reward is recorded. The bound: the advantage is computed in float64
and the loss in float32, and advantages without a std division (Dr. GRPO, RLOO, ...) carry the reward's
scale into the loss and the gradient, whose squared norm overflows float32 near 1e19 per element; a
reward of 1e308 even makes the group's std, and so its advantages, NaN, and the run later dies skipping
non-finite steps. 1e6 is far above any reward scale in use (rewards are scores in [-1, 1] or [0, 10],
sometimes counts) and far below those limits, so a reward past it is a sentinel or an unscaled quantity.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import math
from dataclasses import dataclass, field, replace
from typing import Any

from grpokit.common.errors import RunDataError
from grpokit.environments.env_ids import check_taskset_module
from grpokit.environments.episode_env import load_episode_env
from grpokit.environments.finish import record_finish_reasons
from grpokit.environments.toolsets import tool_sources

MAX_ABS_REWARD = 1e6
REWARD_METRIC_PREFIX = "reward/"  # each reward function's score, env/reward/<function> in metrics.csv


@dataclass
class EnvSpec:
    """One environment of a run.

    Args:
        id: environment id, e.g. reverse-text (built-in) or any installed verifiers taskset id.
        args: the taskset's config fields (e.g. num_tasks).
        name: name used in metrics; defaults to the id.
        ratio: share of each step's prompts drawn from this environment (set it on all or none; the
            default pools all environments' examples).
        env_args: the config fields of the environment's own verifiers `Env`, when it has one (an id
            `user-sim+reverse-text` pairs verifiers' Env `user-sim` with the taskset `reverse-text`, as
            verifiers names pairs), e.g. `{user: {max_turns: 4}}`; see grpokit.environments.episodes.
        judge: a reward from a model added to the rubric's with a weight (`{kind, model, rubric, weight,
            on_failure, ...}`: grpokit.judges.reward.JudgeSettings, docs/judges.md), or a list of them
            (each with its own `name`); null = none.
    """

    id: str
    args: dict[str, Any] = field(default_factory=dict)
    name: str | None = None
    ratio: float | None = None
    env_args: dict[str, Any] = field(default_factory=dict)
    judge: dict[str, Any] | list[dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if self.ratio is not None and not (is_number(self.ratio) and math.isfinite(self.ratio) and self.ratio >= 0):
            raise ValueError(
                f"data.env {self.id!r}: ratio must be a finite number >= 0 (its share of each step's prompts), "
                f"got {self.ratio!r}"
            )


def check_unique_names(specs: list[EnvSpec], key: str) -> None:
    """Two environments of one name would share buffer keys, metrics and samples: refuse them, naming `key`."""
    names = [spec.name or spec.id for spec in specs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(
            f"{key} names the environment(s) {twice} more than once (metrics and buffer keys are per name); "
            "give each entry its own `name`"
        )


@dataclass
class Example:
    """One prompt of an environment: its chat messages, the verifiers task that scores replies, and where
    its verifiers toolsets come from (grpokit.environments.toolsets.ToolSource; None without any)."""

    index: int
    messages: list[dict[str, str]]
    task: Any
    toolsets: Any = None


class Environment:
    """A loaded taskset: `examples` to prompt with and `score` to reward completions."""

    def __init__(self, spec: EnvSpec) -> None:
        self.spec = spec
        self.name = spec.name or spec.id
        env_id, _, taskset_id = spec.id.rpartition("+")
        taskset = load_taskset(replace(spec, id=taskset_id))
        self.episode_env = load_episode_env(spec, env_id, taskset)  # a vf.Env with its own run, or None
        refuse_infinite(spec, taskset)
        tasks = list(taskset)
        self.examples = [
            Example(i, prompt_messages(task.data), task, source)
            for i, (task, source) in enumerate(zip(tasks, tool_sources(taskset, tasks)))
        ]
        if not self.examples:
            raise ValueError(f"environment {spec.id!r} has no examples with args {spec.args}")

    def score(
        self, examples: list[Example], replies: list[str], finish_reasons: list[str] | None = None
    ) -> list[tuple[float, dict[str, float]]]:
        """Reward each reply to its example with the taskset's rubric: (reward, metrics) per reply.
        `finish_reasons`: each reply's, on its trace (grpokit.environments.finish).

        A reward function that raises or returns a non-finite value, a value past MAX_ABS_REWARD, None, a
        str or a bool is an error naming the env and example: training on a made-up reward would bias the
        run without a trace.
        """
        reasons = finish_reasons or [None] * len(replies)
        traces = [
            record_finish_reasons(make_trace(ex.task, reply), f and [f])
            for ex, reply, f in zip(examples, replies, reasons)
        ]
        return self._score_traces(examples, traces)

    def score_conversations(
        self,
        examples: list[Example],
        chats: list[list[dict[str, Any]]],
        states: list | None = None,
        finish_reasons: list[list[str]] | None = None,
    ) -> list[tuple[float, dict[str, float]]]:
        """Reward each multi-turn rollout's whole chat (the prompt's messages, then the replies and the
        environment's messages) with the taskset's rubric, checked like `score`. `states`: each rollout's
        verifiers State (its toolsets'), the rubric's `trace.state`; None for a fresh one.
        `finish_reasons`: each rollout's turns' (grpokit.environments.finish)."""
        states, reasons = states or [None] * len(chats), finish_reasons or [None] * len(chats)
        traces = [
            record_finish_reasons(make_chat_trace(ex.task, chat, len(ex.messages), state), f)
            for ex, chat, state, f in zip(examples, chats, states, reasons)
        ]
        return self._score_traces(examples, traces)

    def _score_traces(self, examples: list[Example], traces: list) -> list[tuple[float, dict[str, float]]]:
        async def score_all() -> list:
            return await asyncio.gather(
                *(ex.task.score(tr) for ex, tr in zip(examples, traces)), return_exceptions=True
            )

        return self.checked_scores(examples, traces, asyncio.run(score_all()))

    def checked_scores(
        self, examples: list[Example], traces: list, outcomes: list
    ) -> list[tuple[float, dict[str, float]]]:
        """(reward, metrics) of each scored trace; `outcomes`: what its scoring raised, else None. A failed
        scoring or a reward that is not a moderate number stops the run naming the env and example."""
        out = []
        for ex, tr, outcome in zip(examples, traces, outcomes):
            if isinstance(outcome, Exception):
                raise RunDataError(
                    f"environment {self.name!r} example {ex.index}: scoring the reply {tr.last_reply!r:.200} failed "
                    f"({type(outcome).__name__}: {outcome}); fix the reward function of data.env id {self.spec.id!r}"
                ) from outcome
            if isinstance(outcome, BaseException):
                raise outcome
            if tr.not_numbers:
                name, value = tr.not_numbers[0]
                raise RunDataError(
                    f"environment {self.name!r} example {ex.index}: reward {name!r} is {value!r:.100} "
                    f"({type(value).__name__}), expected a number; return a float from the reward function "
                    f"of data.env id {self.spec.id!r}"
                )
            reward = tr.reward
            if reward is None or not is_moderate(float(reward)):
                raise RunDataError(
                    f"environment {self.name!r} example {ex.index}: reward is {reward!r}, expected a finite number "
                    f"with |reward| <= {MAX_ABS_REWARD:g}; fix or rescale the reward function of data.env id "
                    f"{self.spec.id!r}"
                )
            metrics = {k: float(v) for k, v in (tr.metrics or {}).items() if isinstance(v, (int, float))}
            out.append((float(reward), {**metrics, **reward_metrics(tr)}))
        return out

    def step_rewards(self, examples: list[Example], replies: list[str]) -> list[list[tuple[int, float]] | None]:
        """Each reply's (end character, reward) steps from its task's `step_rewards(reply)`, or None
        where the task has no such method; an end out of order or out of the reply, or a non-finite
        reward, is an error naming the env and example."""
        out = []
        for ex, reply in zip(examples, replies):
            method = getattr(ex.task, "step_rewards", None)
            pairs = None if method is None else list(method(reply))
            steps = None if pairs is None else [(int(end), float(r) if is_number(r) else math.nan) for end, r in pairs]
            ends = [end for end, _ in steps or []]
            if (
                ends != sorted(ends)
                or any(not 0 < end <= len(reply) for end in ends)
                or not all(is_moderate(r) for _, r in steps or [])
            ):
                raise RunDataError(
                    f"environment {self.name!r} example {ex.index}: step_rewards returned {pairs}; expected (end, "
                    f"reward) pairs with ascending ends in 1..{len(reply)} (the reply's length) and rewards that are "
                    f"finite numbers (not str or bool) with |reward| <= {MAX_ABS_REWARD:g}"
                )
            out.append(steps)
        return out


class UnscoredEnvironment(Environment):
    """An environment whose completions are not verified: every reward is 0, with no metrics and no step
    rewards (`data.buffer.skip_verification`: throughput tests, losses that need no reward). Shares the
    examples of the scored environment it is made from, so evaluation can still score them.
    """

    def __init__(self, env: Environment) -> None:
        self.spec, self.name, self.examples, self.episode_env = env.spec, env.name, env.examples, env.episode_env

    def score(self, examples: list[Example], replies: list[str], finish_reasons=None) -> list[tuple[float, dict]]:
        return [(0.0, {}) for _ in replies]

    def checked_scores(self, examples: list[Example], traces: list, outcomes: list) -> list[tuple[float, dict]]:
        return [(0.0, {}) for _ in traces]

    def score_conversations(
        self, examples: list[Example], chats: list[list[dict[str, Any]]], states=None, finish_reasons=None
    ) -> list[tuple[float, dict[str, float]]]:
        return [(0.0, {}) for _ in chats]

    def step_rewards(self, examples: list[Example], replies: list[str]) -> list[list[tuple[int, float]] | None]:
        return [None for _ in replies]


def reward_metrics(trace: Any) -> dict[str, float]:
    """Each reward function's own score (before its weight) as the metric `reward/<function>`, logged as
    `env/reward/<function>`, when the rubric has two or more: the rollout's reward is their weighted sum,
    which alone does not show which function moved (with one, the reward column already shows it)."""
    rewards = {name: r for name, r in (trace.rewards or {}).items() if r is not None}
    if len(rewards) < 2:
        return {}
    return {f"{REWARD_METRIC_PREFIX}{name}": float(r.score) for name, r in rewards.items()}


def refuse_infinite(spec: EnvSpec, taskset: Any) -> None:
    """Refuse a taskset that yields tasks forever (verifiers' `Taskset.INFINITE`, unless a view such as
    `take(n)` bounds it: `bounded` False), naming data.env and the fix: grpokit lists every example at
    start, so listing it would never end."""
    if getattr(taskset, "bounded", True):
        return
    raise ValueError(
        f"data.env id {spec.id!r}: its taskset {type(taskset).__name__} is infinite (INFINITE = True: its load() "
        "yields tasks forever), and grpokit lists an environment's examples at start; use a finite taskset, e.g. "
        "a subclass with INFINITE = False whose load() yields a fixed number of tasks "
        "(itertools.islice(super().load(), n))"
    )


def load_taskset(spec: EnvSpec):
    """The verifiers Taskset of `spec`; args the taskset's config does not accept are an error naming data.env."""
    import pydantic

    try:
        return _load_taskset(spec)
    except pydantic.ValidationError as e:
        raise ValueError(bad_args_message(spec, e)) from e


def bad_args_message(spec: EnvSpec, error, accepted: list[str] | None = None) -> str:
    """The data.env error for args a taskset's config rejected: each problem, and the accepted args
    where known (a built-in environment's config class)."""
    problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in error.errors())
    return f"data.env id {spec.id!r}: bad args {spec.args}: {problems}" + (
        f" (accepted args: {', '.join(accepted)})" if accepted else ""
    )


def _load_taskset(spec: EnvSpec):
    import pydantic
    import verifiers.v1 as vf

    module_name = spec.id.split("/")[-1].split("@")[0].replace("-", "_").lower()
    try:
        module = importlib.import_module(f"grpokit.envs.{module_name}")
    except ModuleNotFoundError as e:
        if e.name != f"grpokit.envs.{module_name}":
            raise
        try:
            check_taskset_module(spec.id, builtin_env_ids())  # `json`: not an environment, named with the fix
            return vf.load_environment(vf.resolve_env_config({"taskset": {"id": spec.id, **spec.args}})).taskset
        except ModuleNotFoundError as e2:
            raise ValueError(
                f"unknown environment id {spec.id!r} (data.env): not a "
                f"built-in ({builtin_env_ids()}) and verifiers says: {e2}"
            ) from e2
    taskset_classes = [
        getattr(module, n)
        for n in getattr(module, "__all__", [])
        if isinstance(getattr(module, n), type) and issubclass(getattr(module, n), vf.Taskset)
    ]
    if len(taskset_classes) != 1:
        raise ValueError(f"environment module {module.__name__} must export exactly one Taskset in __all__")
    cls = taskset_classes[0]
    config_cls = cls.__orig_bases__[0].__args__[1] if hasattr(cls, "__orig_bases__") else vf.TasksetConfig
    try:
        config = config_cls(id=spec.id, **spec.args)
    except pydantic.ValidationError as e:
        raise ValueError(
            bad_args_message(spec, e, sorted(set(config_cls.model_fields) - set(vf.TasksetConfig.model_fields)))
        ) from e
    return cls(config)


def builtin_env_ids() -> list[str]:
    import pkgutil

    import grpokit.envs

    return sorted(m.name.replace("_", "-") for m in pkgutil.iter_modules(grpokit.envs.__path__))


def prompt_messages(data: Any) -> list[dict[str, str]]:
    """The chat a verifiers single-turn harness sends: the system prompt, then the prompt."""
    messages = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    if isinstance(data.prompt, str):
        messages.append({"role": "user", "content": data.prompt})
    else:
        messages += [m.model_dump(exclude_none=True) for m in data.prompt or []]
    return messages


def is_number(value: Any) -> bool:
    """False for a str, bytes or bool (Python's or NumPy's), which float() would turn into a number."""
    return not isinstance(value, (str, bytes, bool)) and type(value).__name__ != "bool_"


def is_moderate(reward: float) -> bool:
    """Whether a reward is finite and within MAX_ABS_REWARD (see the module docstring for the bound)."""
    return math.isfinite(reward) and abs(reward) <= MAX_ABS_REWARD


@functools.cache
def checked_trace_class() -> type:
    """verifiers' Trace, recording the rewards that are not numbers: its record_reward casts them with
    float(), so after scoring a str or a bool can no longer be told from a number."""
    import pydantic
    import verifiers.v1 as vf

    class CheckedTrace(vf.Trace):
        _not_numbers: list = pydantic.PrivateAttr(default_factory=list)

        @property
        def not_numbers(self) -> list[tuple[str, Any]]:
            """(name, value) of each reward recorded as a str, bytes or bool (Python's or NumPy's)."""
            return self._not_numbers

        def record_reward(self, name: str, value: float, weight: float = 1.0) -> None:
            if not is_number(value):
                self._not_numbers.append((name, value))
            super().record_reward(name, value, weight)

    return CheckedTrace


def make_chat_trace(task: Any, chat: list[dict[str, Any]], num_prompt_messages: int = 0, state: Any = None):
    """A finished verifiers Trace of a whole conversation: one message node per message, each the
    child of the one before; the assistant messages after the prompt's are marked sampled (a prompt's
    few-shot replies are not the model's). `state`: the rollout's verifiers State (else a fresh one of
    the task's State type, as verifiers starts a rollout with)."""
    import verifiers.v1 as vf
    from verifiers.v1.configs.agent import AgentConfig
    from verifiers.v1.graph import MessageNode
    from verifiers.v1.state import state_cls
    from verifiers.v1.trace import AgentInfo, TraceTask

    kinds = {"system": vf.SystemMessage, "user": vf.UserMessage, "assistant": vf.AssistantMessage}
    nodes = []
    for i, m in enumerate(chat):
        message = kinds[m["role"]](content=m["content"]) if m["role"] in kinds else None
        if message is None:  # tool results, and any other role an environment speaks as
            message = vf.ToolMessage(content=m["content"], tool_call_id=m.get("tool_call_id", f"call_{i}"))
        sampled = m["role"] == "assistant" and i >= num_prompt_messages
        nodes.append(MessageNode(parent=i - 1 if i else None, sampled=sampled, message=message))
    data = task.data
    return checked_trace_class()(
        task=TraceTask(type=type(task).__name__, data=data, key=task.key, hash=task.hash),
        agent=AgentInfo(config=AgentConfig(model="grpokit")),
        nodes=nodes,
        state=state if state is not None else state_cls(type(task))(),
        is_completed=True,
        ok=True,
    )


def make_trace(task: Any, reply: str):
    """A finished single-turn verifiers Trace: the task's prompt and our engine's reply."""
    import verifiers.v1 as vf
    from verifiers.v1.configs.agent import AgentConfig
    from verifiers.v1.graph import MessageNode
    from verifiers.v1.trace import AgentInfo, TraceTask

    data, nodes, parent = task.data, [], None
    if data.system_prompt:
        nodes.append(MessageNode(message=vf.SystemMessage(content=data.system_prompt)))
        parent = 0
    prompt = data.prompt if isinstance(data.prompt, list) else [vf.UserMessage(content=data.prompt)]
    for message in prompt:  # a list: the task's own messages (e.g. a user message with image parts)
        nodes.append(MessageNode(parent=parent, message=message))
        parent = len(nodes) - 1
    nodes.append(MessageNode(parent=len(nodes) - 1, sampled=True, message=vf.AssistantMessage(content=reply)))
    return checked_trace_class()(
        task=TraceTask(type=type(task).__name__, data=data, key=task.key, hash=task.hash),
        agent=AgentInfo(config=AgentConfig(model="grpokit")),
        nodes=nodes,
        is_completed=True,
        ok=True,
    )
