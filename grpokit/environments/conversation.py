"""One multi-turn rollout as it grows, and what an environment answers between two assistant turns.

A task (a verifiers Task of a grpokit environment) takes part in the conversation through optional
members, found by name like `step_rewards` (grpokit.environments.environment):

    tools: list of Python functions the model may call (Hermes `<tool_call>` syntax,
        grpokit.environments.tools). Without `respond`, a reply with tool calls is answered with their
        results, and a reply without one ends the rollout.
    respond(messages, state) -> EnvTurn | list[dict] | None: the environment's turn after each reply
        (a simulated user, a game's next observation). `messages` is the chat so far, ending with the
        model's reply; `state` a dict the task may keep anything in for this rollout. None (or an
        EnvTurn with done=True) ends the rollout. A message's content is a str, or a list of text and
        image parts holding an image (a vision-language policy: grpokit.environments.image_turns). A
        task with both `tools` and `respond` gets the tool results for a reply with calls, and `respond`
        for a reply without.
    max_turns: the most assistant turns of a rollout (else data.max_turns).
    tool_timeout: seconds a tool may run (else 10): a finite number > 0, else the run stops naming it.
    respond_timeout: seconds `respond` may run (else 300, as an Env episode's code between two turns):
        past it the run stops naming the environment and example, as for a `respond` that raises (it
        runs in a daemon worker thread, so a `respond` that never returns does not keep the process).

An environment turn whose messages hold more characters than the tokens left in the budget can render
(each token holds at most the tokenizer's longest vocabulary entry) ends the rollout, truncated, before
it is rendered, as the budget would after rendering: a 10 MB `respond` message used to be tokenised every
turn. It is logged (a WARNING naming the environment and example, at the first and every
LONG_WARN_EVERY-th) and counted in `env/oversized_turns`.

A verifiers Task with `toolsets` (or whose Taskset has them) is multi-turn too: their `@vf.tool` methods
are tools like `tools`, called in this process (grpokit.environments.toolsets); the Example carries
their ToolSource, and the rollout's toolsets are set up at its first tool call.

Every assistant turn's tokens are the engine's; every environment token is rendered from the
environment's messages alone (grpokit.environments.chat_tokens; with images, image_turns) and has mask 0,
logprob 0. Both `respond` and a tool may bring pictures (a tool's: grpokit.environments.tool_images).
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import numbers
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from grpokit.common.errors import RunDataError
from grpokit.environments.chat_tokens import text_chars
from grpokit.environments.environment import MAX_ABS_REWARD, is_moderate, is_number
from grpokit.environments.tool_images import checked_pictures, portable_parts
from grpokit.environments.tools import ToolResult, parse_tool_calls, run_tool_calls
from grpokit.environments.toolsets import SETUP_TIMEOUT
from grpokit.environments.workers import POOL
from grpokit.inference import Completion
from grpokit.vision.images import PixelBudget
from grpokit.vision.inputs import with_turn
from grpokit.vision.messages import has_images, split_images

log = logging.getLogger(__name__)
DEFAULT_TOOL_TIMEOUT = 10.0
DEFAULT_RESPOND_TIMEOUT = 300.0  # as episodes.SETTLE_TIMEOUT: an environment's own code between two turns
LONG_WARN_EVERY = 100  # an environment's oversized turns are logged at the first and every this many after
OVERSIZED_TURNS = "oversized_turns"  # the batch metric env/oversized_turns
_OVERSIZED: Counter = Counter()  # oversized turns per environment name, this process
_OVERSIZED_LOCK = threading.Lock()
NONFINITE_LOGPROBS = "nonfinite_logprobs"  # the batch metric env/nonfinite_logprobs


@dataclass
class EnvTurn:
    """The environment's answer to a reply: messages for the model, whether the rollout ends, and this
    turn's reward (per-turn rewards reach the `process` advantage as step rewards)."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False
    reward: float | None = None


@dataclass
class Conversation:
    """A rollout of several turns: the prompt, then the completion region (assistant and environment
    tokens, masked 1 and 0), the chat as messages (for the environment and the score) and its counters."""

    env: Any
    example: Any
    prompt_ids: list[int]
    messages: list[dict[str, Any]]
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)
    policy_steps: list[int] = field(default_factory=list)
    token_steps: list[int] = field(default_factory=list)  # per token in `ids`: the weight step that wrote it
    turn_ends: list[int] = field(default_factory=list)  # index in `ids` of each assistant turn's last token
    turn_rewards: list[float | None] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)  # each assistant turn's (grpokit.inference.finish)
    tool_calls: int = 0
    tool_errors: int = 0
    tool_timeouts: int = 0
    oversized_turns: int = 0  # environment turns too long to fit the budget (the rollout ended at the first)
    env_time: float = 0.0
    toolsets: Any = None  # the rollout's verifiers toolsets (RolloutToolsets), from its first tool call on
    vision: Any = None  # the sequence's image inputs (VisionInputs): the first prompt's, then later turns'
    later_images: int = 0  # images the environment's turns added (grpokit.environments.image_turns)
    done: bool = False
    is_truncated: bool = False

    @classmethod
    def opening(cls, env: Any, example: Any, prompt_ids: list[int], vision: Any = None) -> Conversation:
        """A conversation of `example` before its first reply: its prompt's ids, messages and image inputs."""
        return cls(env, example, list(prompt_ids), [dict(m) for m in example.messages], vision=vision)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.ids)

    @property
    def turns(self) -> int:
        return len(self.turn_ends)

    @property
    def images_held(self) -> int:
        """Images the conversation holds: its first prompt's and the environment's later turns'."""
        return len(split_images(self.example.messages)[1]) + self.later_images

    @property
    def finish_reason(self) -> str:
        """The rollout's: "abort" when its last reply was aborted, else "length" when it ended truncated
        (a reply at max_tokens, or the budget), else "stop"."""
        if self.finish_reasons[-1:] == ["abort"]:
            return "abort"
        return "length" if self.is_truncated else "stop"

    def add_completion(self, completion: Completion, text: str) -> None:
        """Append an assistant turn: the engine's tokens and logprobs, trained on."""
        self.ids += completion.token_ids
        self.mask += [1] * len(completion.token_ids)
        self.logprobs += completion.logprobs
        self.policy_steps.append(completion.policy_step)
        self.token_steps += completion.token_steps or [completion.policy_step] * len(completion.token_ids)
        self.turn_ends.append(len(self.ids) - 1)
        self.finish_reasons.append(completion.finish_reason)
        self.messages.append({"role": "assistant", "content": text})

    def add_environment(
        self, token_ids: list[int], messages: list[dict[str, Any]], vision: Any = None, images: int = 0
    ) -> None:
        """Append the environment's turn: its tokens (no loss, no logprobs) and messages; `vision`: the
        image inputs of its `images` images (VisionInputs), appended to the conversation's (its pictures and
        ids before expansion too, for vLLM: grpokit.vision.inputs.grown_source)."""
        if vision:
            self.vision = with_turn(self.vision, vision, self.prompt_ids + self.ids)
            self.later_images += images
        self.ids += token_ids
        self.mask += [0] * len(token_ids)
        self.logprobs += [0.0] * len(token_ids)
        self.token_steps += self.token_steps[-1:] * len(token_ids)  # no loss on them: the reply's step
        self.messages += messages

    def metrics(self) -> dict[str, float]:
        """The rollout's counters as env/ metrics; `oversized_turns` only when one happened (a rare fault,
        so its column appears in metrics.csv only in runs that have it)."""
        return {
            "turns": float(self.turns),
            "tool_calls": float(self.tool_calls),
            "tool_errors": float(self.tool_errors),
            "tool_timeouts": float(self.tool_timeouts),
            "env_time": self.env_time,
            **({OVERSIZED_TURNS: float(self.oversized_turns)} if self.oversized_turns else {}),
        }


def is_multi_turn(task: Any, toolsets: Any = None) -> bool:
    """Whether a task takes part in a conversation: it has tools, a respond method, or verifiers
    toolsets (`toolsets`: its Example's ToolSource)."""
    return bool(getattr(task, "tools", None)) or callable(getattr(task, "respond", None)) or toolsets is not None


def environment_turn(conv: Conversation, last_turn: bool = False, budget: PixelBudget | None = None) -> EnvTurn:
    """The environment's answer to the conversation's last reply (timed into conv.env_time): tool
    results when the reply calls tools, else the task's `respond`, else the end of the rollout. On the
    last turn allowed, tools are not run (nobody would read their results); `respond` still is, for
    its turn reward. A `respond` that raises stops the run naming the environment and example, as a
    reward function that raises does: a made-up answer would train silently. A tool's picture that cannot
    be used within `budget` (data.pixel_budget) is the tool's error (grpokit.environments.tool_images)."""
    task, start = conv.example.task, time.perf_counter()
    try:
        tools = {fn.__name__: fn for fn in getattr(task, "tools", None) or []}
        source = getattr(conv.example, "toolsets", None)
        calls = parse_tool_calls(conv.messages[-1]["content"]) if tools or source else []
        if calls and last_turn:
            return EnvTurn(done=True)
        if calls:
            tools.update(_toolset_tools(conv, source))
            results = run_tool_calls(tools, calls, tool_timeout(conv), _where(conv))
            if any(isinstance(r.content, list) for r in results):  # a picture: held to data.pixel_budget
                results = checked_pictures(results, budget, conv.images_held, _where(conv))
            _count(conv, results)
            return EnvTurn(messages=[{"role": "tool", "content": r.content} for r in results])
        respond = getattr(task, "respond", None)
        if respond is None:
            return EnvTurn(done=True)
        return as_env_turn(_respond(conv, respond), conv)
    finally:
        conv.env_time += time.perf_counter() - start


def _toolset_tools(conv: Conversation, source: Any) -> dict[str, Any]:
    """The rollout's verifiers toolset tools, its toolsets set up at the first call; a setup that raises
    or hangs stops the run naming the environment, as a `respond` that raises does."""
    if source is None:
        return {}
    if conv.toolsets is None:
        try:
            conv.toolsets = source.open(conv.example.task)
        except Exception as e:
            raise ValueError(
                f"environment {conv.env.name!r} example {conv.example.index}: setting up its verifiers toolsets "
                f"failed ({type(e).__name__}: {e}); setup and setup_task may take {SETUP_TIMEOUT:g} s"
            ) from e
    return conv.toolsets.tools


def as_env_turn(answer: Any, conv: Conversation) -> EnvTurn:
    """A task's `respond` result as an EnvTurn: None is the end, a list is messages; an image part holding a
    PIL image or bytes becomes a `data:` URL part (the chat stays JSON, as verifiers' messages take it)."""
    if answer is None:
        return EnvTurn(done=True)
    if isinstance(answer, EnvTurn):
        turn = answer
    elif isinstance(answer, list):
        turn = EnvTurn(messages=answer)
    else:
        raise TypeError(
            f"environment {conv.env.name!r} example {conv.example.index}: respond() returned "
            f"{type(answer).__name__}; return an EnvTurn, a list of messages, or None to end the rollout"
        )
    for m in turn.messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not is_turn_content(m.get("content")):
            raise TypeError(
                f"environment {conv.env.name!r} example {conv.example.index}: respond() returned the message "
                f"{m!r:.200}; a message is a dict with str 'role' and 'content' a str, or a list of text and "
                "image parts holding an image (docs/vision.md)"
            )
    if not turn.done and not turn.messages:
        raise ValueError(
            f"environment {conv.env.name!r} example {conv.example.index}: respond() returned no messages and "
            "done=False; return None (or done=True) to end the rollout"
        )
    turn.messages = [{**m, "content": portable_parts(m["content"], _where(conv))} for m in turn.messages]
    if turn.reward is not None and not (is_number(turn.reward) and _is_moderate_number(turn.reward)):
        raise RunDataError(  # held to the rule of rubric rewards: a NaN would zero its group's advantages
            f"environment {conv.env.name!r} example {conv.example.index}: respond() returned a turn reward of "
            f"{turn.reward!r:.100} ({type(turn.reward).__name__}); EnvTurn.reward must be None or a finite number "
            f"(not str or bool) with |reward| <= {MAX_ABS_REWARD:g}"
        )
    return turn


def _is_moderate_number(value: Any) -> bool:
    try:
        return is_moderate(float(value))
    except (TypeError, ValueError, OverflowError):
        return False


def tool_timeout(conv: Conversation) -> float:
    """The task's `tool_timeout` (else DEFAULT_TOOL_TIMEOUT), checked by `task_seconds`."""
    return task_seconds(conv, "tool_timeout", DEFAULT_TOOL_TIMEOUT)


def respond_timeout(conv: Conversation) -> float:
    """The task's `respond_timeout` (else DEFAULT_RESPOND_TIMEOUT), checked by `task_seconds`."""
    return task_seconds(conv, "respond_timeout", DEFAULT_RESPOND_TIMEOUT)


def task_seconds(conv: Conversation, name: str, default: float) -> float:
    """The task's timeout attribute `name` (else `default`); 0, a negative number, NaN, inf or a
    non-number would make every call time out at once or never, so it stops the run naming the task."""
    value = getattr(conv.example.task, name, None)
    if value is None:
        return default
    seconds = float(value) if is_number(value) and isinstance(value, numbers.Real) else math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise RunDataError(
            f"{_where(conv)}: the task's {name} is {value!r:.50}; "
            f"set it to a finite number of seconds > 0 (or leave it out for {default:g} s)"
        )
    return seconds


def _respond(conv: Conversation, respond: Any) -> Any:
    """The task's `respond(messages, state)`, run in a worker thread within its respond_timeout. One that
    raises or runs past the timeout stops the run naming the environment and example: a made-up answer
    would train silently. The hung call's thread is a daemon, given up on: the process still exits."""
    seconds = respond_timeout(conv)
    future = POOL.submit(respond, conv.messages, conv.state)
    try:
        return future.result(timeout=seconds)
    except concurrent.futures.TimeoutError:
        POOL.abandon(future)
        raise RunDataError(
            f"{_where(conv)}: respond() did not return within {seconds:g} s (the task's respond_timeout, "
            f"default {DEFAULT_RESPOND_TIMEOUT:g}); fix the environment's respond method, or raise respond_timeout "
            "if it is slow by design"
        ) from None
    except Exception as e:
        raise ValueError(
            f"{_where(conv)}: respond() raised {type(e).__name__}: {e}; fix the environment's respond method"
        ) from e


def over_budget(conv: Conversation, chat: Any, messages: list[dict[str, Any]], room: int) -> bool:
    """Whether the environment turn's `messages` certainly take more than the `room` tokens left
    (ChatTokens.cannot_fit, from their length alone); such a turn is counted in conv.oversized_turns and
    logged at the environment's first and every LONG_WARN_EVERY-th, and the caller ends the rollout."""
    if not chat.cannot_fit(messages, room):
        return False
    conv.oversized_turns += 1
    with _OVERSIZED_LOCK:
        _OVERSIZED[conv.env.name] += 1
        count = _OVERSIZED[conv.env.name]
    if count == 1 or count % LONG_WARN_EVERY == 0:
        log.warning(
            "%s: the environment's turn has %d characters, more than the %d tokens left of the budget can hold "
            "(data.seq_len less the conversation so far and data.sampling.max_tokens); the rollout ends there, "
            "truncated, without rendering them (%d such turns of this environment so far, env/%s)",
            _where(conv),
            text_chars(messages),
            max(room, 0),
            count,
            OVERSIZED_TURNS,
        )
    return True


def _where(conv: Conversation) -> str:
    """How errors and warnings name the conversation: its environment and example."""
    return f"environment {conv.env.name!r} example {conv.example.index}"


def _count(conv: Conversation, results: list[ToolResult]) -> None:
    conv.tool_calls += len(results)
    conv.tool_errors += sum(r.status == "error" for r in results)
    conv.tool_timeouts += sum(r.status == "timeout" for r in results)


def masked_if_nonfinite(
    logprobs: list[float], mask: list[int], metrics: dict[str, float], env_name: str, example_index: int
) -> tuple[list[float], list[int], dict[str, float]]:
    """A rollout's (logprobs, mask, metrics): as they are, or, when an engine logprob is NaN or infinite
    (a numerics fault in the engine, or a server's bad answer), all 0 (not trained on) with the rollout
    counted in metrics. Its reward is kept, so its group's baseline is unchanged. Single-turn and
    multi-turn rollouts alike."""
    if all(map(math.isfinite, logprobs)):
        return logprobs, mask, metrics
    log.warning(
        "environment %r example %d: the engine returned %d non-finite logprobs of %d; the completion is masked "
        "out of the loss",
        env_name,
        example_index,
        sum(not math.isfinite(x) for x in logprobs),
        len(logprobs),
    )
    return [0.0] * len(logprobs), [0] * len(logprobs), {**metrics, NONFINITE_LOGPROBS: 1.0}


def is_turn_content(content: Any) -> bool:
    """A message content the environment's turn can render: a str, or a list of part dicts holding an image
    (grpokit.environments.image_turns; the processor renders it, so a list of text parts alone is not).
    `respond`'s messages and an Env episode's `turn()` messages (grpokit.environments.episodes) are held to it."""
    if isinstance(content, str):
        return True
    parts = isinstance(content, list) and all(isinstance(p, dict) for p in content)
    return parts and has_images([{"content": content}])
