"""Prompts' groups played in one GenerationStream: the one place that turns engine completions into
scored groups, for every kind of prompt.

- Single-turn: a prompt's G completions are one request (n = G); the group is scored when it returns.
- Multi-turn tasks (tools, `respond`, verifiers toolsets): the first turn is the group's request, then
  each conversation's next turn is a request of its own (n = 1, its ids so far as the prompt),
  submitted as soon as the environment has answered (grpokit.environments.multi_turn.take_turn, with
  the budget and max_turns), so a short conversation does not wait for its group's long one; the group
  is scored when its last conversation ends.
- verifiers Env episodes (grpokit.environments.episodes): a prompt's G episodes start when it is
  submitted, every role that waits for a reply is a request of its own, and the episode's code runs on
  as each reply comes back; the group is scored (the Env's finalize included) when its last episode ends.

A group is scored when its last completion returns; a judge's part of its reward (grpokit.judges) is
asked on the judge's own thread while the stream generates on, and the group is handed on, in the order
the groups finished, once the judge has answered (grpokit.judges.deferred).

The rollout driver (grpokit.orchestrator.driver) decides what is submitted when and what the finished
groups are for; `generate_rollouts` (grpokit.orchestrator.rollouts) plays a list of prompts to the end.
"""

from __future__ import annotations

import collections
import concurrent.futures
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from grpokit.environments.chat_tokens import ChatTokens
from grpokit.environments.conversation import Conversation, is_multi_turn
from grpokit.environments.episodes import Episode, EpisodeLimits, EpisodeTable, Role
from grpokit.environments.image_turns import TURN_PICTURE, ImageTurns
from grpokit.environments.multi_turn import SEED_STRIDE, conversation_rollouts, take_turn
from grpokit.environments.tool_images import image_turn_source
from grpokit.environments.toolsets import close_toolsets
from grpokit.inference import InferenceEngine, SamplingSettings
from grpokit.inference.streams import BatchedStream, FinishedGroup, GenerationStream, GroupRequest
from grpokit.judges.deferred import Deferred, complete, deferring, ready
from grpokit.orchestrator.prompt_length import prompt_token_ids
from grpokit.orchestrator.rollouts import TurnLimits, sampled_group
from grpokit.types import Rollout

JUDGE_WAIT = 0.1  # seconds advance waits for a judge when nothing is left to generate


@dataclass
class PendingGroup:
    """A prompt to play: its environment and example, its token ids, its group id and sampling seed, and
    its image inputs (grpokit.orchestrator.image_prompts; None for a text prompt)."""

    env: object
    example: object
    prompt_ids: list[int]
    group_id: int
    seed: int | None
    submitted: float = 0.0
    vision: object = None


@dataclass
class _Conversations:
    """A multi-turn prompt's G conversations in the stream."""

    pending: PendingGroup
    convs: list[Conversation]

    @property
    def open(self) -> int:
        return sum(not c.done for c in self.convs)

    def rollouts(self, tokenizer) -> list[Rollout]:
        """The G rollouts, each with its own conversation's image inputs (its first prompt's, and any its
        environment's later turns added: rollouts of one group may hold different pictures)."""
        close_toolsets(self.convs)
        return conversation_rollouts([self.convs], self.pending.group_id, tokenizer)[0]


@dataclass
class _Turn:
    """One conversation's next turn, as a stream request's key."""

    state: _Conversations
    conv: Conversation


@dataclass
class _Episodes:
    """A verifiers Env prompt's G episodes in the stream; `asked`: the replies already requested (each
    waiting role's future)."""

    pending: PendingGroup
    episodes: list[Episode]
    asked: set = field(default_factory=set)


@dataclass
class _RoleTurn:
    """A waiting role's next reply, as a stream request's key."""

    state: _Episodes
    role: Role


class GroupPlay:
    """Groups in flight in `stream` (see the module docstring): `submit` a prompt, `advance` the stream
    and get the groups that completed, scored, in the order they completed."""

    def __init__(self, stream: GenerationStream, engine, tokenizer, group_size: int, turns: TurnLimits) -> None:
        self.stream, self.engine, self.tokenizer, self.group_size = stream, engine, tokenizer, group_size
        self.max_turns = turns.max_turns
        self.budget = min(turns.budget or sys.maxsize, engine.context_length() or sys.maxsize)
        self.max_tokens = stream.sampling.max_tokens
        self.chat: ChatTokens | None = None  # for multi-turn prompts, made at the first one
        self.images = ImageTurns(tokenizer, turns.pixel_budget)  # later turns with images; loads when one comes
        self.episodes: EpisodeTable | None = None  # verifiers Env episodes in play, made at the first one
        self.open = 0  # prompts submitted whose group has not been handed out (generated and judged)
        self._scored: collections.deque[tuple[PendingGroup, list[Rollout], list[Deferred]]] = collections.deque()

    def submit(self, pending: PendingGroup) -> None:
        self.open += 1
        if getattr(pending.env, "episode_env", None) is not None:
            self._start_episodes(pending)
        else:
            if pending.vision is not None and not self.stream.takes_images:
                raise ValueError(
                    f"environment {getattr(pending.env, 'name', pending.env)!r} has prompts with images, which "
                    f"{type(self.engine).__name__} cannot sample yet: use inference BuiltinEngine with fast: off, or "
                    "RemoteEngine in front of `grpokit infer` (docs/vision.md)"
                )
            request = GroupRequest(pending, pending.prompt_ids, self.group_size, pending.seed, vision=pending.vision)
            self.stream.submit(request)

    def advance(self) -> list[tuple[PendingGroup, list[Rollout]]]:
        """One advance of the stream; the groups completed since (any an episode start completed too), in
        the order their generation ended, each once its judges have answered (grpokit.judges.deferred).
        With nothing left to generate, it waits up to JUDGE_WAIT seconds for the oldest group's judges."""
        self._collect(self.stream.advance())
        if self._scored and not ready(self._scored[0][2]) and not self.stream.inflight:
            concurrent.futures.wait([f for d in self._scored[0][2] for f in d.futures], timeout=JUDGE_WAIT)
        completed = []
        while self._scored and ready(self._scored[0][2]):
            pending, rollouts, deferred = self._scored.popleft()
            self.open -= 1
            completed.append((pending, complete(rollouts, deferred)))
        return completed

    def close(self) -> None:
        self.stream.close()
        if self.episodes is not None:
            self.episodes.close()
            self.episodes = None

    # --- what comes back -----------------------------------------------------------------------------

    def _collect(self, finished: list[FinishedGroup]) -> None:
        """Score the groups that finished; a multi-turn group's finished turns go on to the next."""
        for group in finished:
            key = group.request.key
            if isinstance(key, _RoleTurn):
                key.role.waiting.set_result(group.completions[0])
                self._play(key.state)
            elif isinstance(key, _Turn):
                take_turn(key.conv, group.completions[0], *self._turn_args())
                if not key.conv.done:
                    self._next_turn(key.state, key.conv)
                elif not key.state.open:
                    self._score(key.state.pending, lambda state=key.state: state.rollouts(self.tokenizer))
            elif is_multi_turn(key.example.task, getattr(key.example, "toolsets", None)):
                self._start_conversations(key, group.completions)
            else:
                self._score(
                    key,
                    lambda key=key, group=group: sampled_group(
                        key.env,
                        key.example,
                        key.prompt_ids,
                        group.completions,
                        key.group_id,
                        self.tokenizer,
                        key.vision,
                    ),
                )

    def _score(self, pending: PendingGroup, rollouts_of: Callable[[], list[Rollout]]) -> None:
        """Score a group that finished generating; a judge's part comes later, while the engine goes on."""
        with deferring() as deferred:
            rollouts = rollouts_of()
        self._done(pending, rollouts, deferred)

    def _done(self, pending: PendingGroup, rollouts: list[Rollout], deferred: list[Deferred] | None = None) -> None:
        self._scored.append((pending, rollouts, deferred or []))

    def _start_conversations(self, p: PendingGroup, completions: list) -> None:
        """A multi-turn prompt's first turn finished: G conversations, each continuing on its own."""
        self.chat = self.chat or ChatTokens(self.tokenizer)
        state = _Conversations(p, [Conversation.opening(p.env, p.example, p.prompt_ids, p.vision) for _ in completions])
        for conv, completion in zip(state.convs, completions):
            take_turn(conv, completion, *self._turn_args())
            if not conv.done:
                self._next_turn(state, conv)
        if not state.open:
            self._score(p, lambda: state.rollouts(self.tokenizer))

    def _start_episodes(self, p: PendingGroup) -> None:
        """An Env-episode prompt: its G episodes start, and play until they wait for replies."""
        if self.episodes is None:
            # every role's turns go through the one stream: a fixed cache (the fast path's) bounds them all
            context = min(self.engine.context_length() or sys.maxsize, self.stream.max_len or sys.maxsize)
            limits = EpisodeLimits(self.max_tokens, self.budget, self.max_turns, context)
            self.episodes = EpisodeTable(self.tokenizer, limits, self.images)
        self._play(_Episodes(p, self.episodes.start(p.env, p.example, self.group_size)))

    def _play(self, state: _Episodes) -> None:
        """Run the episodes' code on; a role newly waiting for a reply becomes a request, and a group whose
        episodes have all ended is scored."""
        for role in self.episodes.settle(state.episodes):
            if role.waiting not in state.asked:
                state.asked.add(role.waiting)
                if role.conv.later_images:  # a turn() message brought pictures
                    self._check_later_images(role.conv, TURN_PICTURE)
                elif role.conv.vision is not None and not self.stream.takes_images:
                    raise ValueError(
                        f"environment {role.conv.env.name!r} example {role.conv.example.index}: an episode's prompt "
                        f"holds images, which {type(self.engine).__name__} cannot sample yet: use inference "
                        "BuiltinEngine with fast: off, RemoteEngine in front of `grpokit infer`, or VLLMEngine"
                    )
                ids = role.conv.prompt_ids + role.conv.ids
                self.stream.submit(GroupRequest(_RoleTurn(state, role), ids, 1, vision=role.conv.vision))
        if all(ep.handle.done() for ep in state.episodes):
            convs, scores = self.episodes.finish(state.episodes)
            p = state.pending
            self._done(p, conversation_rollouts([convs], p.group_id, self.tokenizer, [scores])[0])

    def _next_turn(self, state: _Conversations, conv: Conversation) -> None:
        """A conversation's next turn, seeded `seed * SEED_STRIDE + turn` (a stream that runs whole batches
        samples each turn of a block with its own seed; an incremental one uses it only when idle)."""
        seed = state.pending.seed
        seed = None if seed is None else seed * SEED_STRIDE + conv.turns
        ids = conv.prompt_ids + conv.ids
        if conv.later_images:
            self._check_later_images(conv)
        self.stream.submit(GroupRequest(_Turn(state, conv), ids, 1, seed, vision=conv.vision))

    def _check_later_images(self, conv: Conversation, source: str | None = None) -> None:
        """A conversation whose environment's turn (`respond`, a tool, an Env episode's `turn()`: `source`)
        added images goes on only on an engine that samples them (`later_turn_images`: BuiltinEngine's plain
        path, RemoteEngine in front of `grpokit infer`, VLLMEngine); BuiltinEngine's fast path is refused."""
        if self.stream.takes_images and getattr(self.engine, "later_turn_images", False):
            return
        source = source or image_turn_source(conv.messages)
        raise ValueError(
            f"environment {conv.env.name!r} example {conv.example.index}: {source}, "
            f"which {type(self.engine).__name__} cannot sample in a later turn yet: use inference "
            "BuiltinEngine with fast: off, RemoteEngine in front of `grpokit infer`, or VLLMEngine; or put the "
            "pictures in the first prompt (docs/vision.md)"
        )

    def _turn_args(self) -> tuple:
        return self.tokenizer, self.chat, self.budget, self.max_tokens, self.max_turns, self.images


def generate_rollouts(
    engine: InferenceEngine,
    tokenizer,
    prompts: list[tuple[object, object]],
    rollouts_per_example: int,
    sampling: SamplingSettings,
    first_group_id: int,
    prompt_ids: list[list[int]] | None = None,
    turns: TurnLimits | None = None,
    vision: dict | None = None,
) -> list[list[Rollout]]:
    """Play every prompt's group to its end in a stream of its own (GroupPlay; every prompt admitted at
    once, seeded with sampling.seed, so single-turn prompts sample exactly what `engine.generate` would);
    one scored group per prompt, in prompt order, with consecutive group ids from first_group_id.
    `prompt_ids`: the prompts' token ids when the caller has them already, else they are tokenised here.
    `vision`: image prompts' inputs by id(example), with their `prompt_ids` (ImagePrompts.render_all).
    The evaluator's (and tests') way to sample; training goes through the rollout driver."""
    vision = vision or {}
    if not prompts:  # every prompt of the block was too long (grpokit.orchestrator.prompt_length)
        return []
    if prompt_ids is None:
        prompt_ids = [prompt_token_ids(tokenizer, ex) for _, ex in prompts]
    turns = turns or TurnLimits()
    max_len = turns.budget or max(len(ids) for ids in prompt_ids) + sampling.max_tokens  # a static cache's rows
    stream = whole_batch_stream(engine, sampling, len(prompts) * rollouts_per_example, max_len)
    play = GroupPlay(stream, engine, tokenizer, rollouts_per_example, turns)
    groups: dict[int, list[Rollout]] = {}
    try:
        for g, ((env, ex), ids) in enumerate(zip(prompts, prompt_ids)):
            play.submit(PendingGroup(env, ex, ids, first_group_id + g, sampling.seed, vision=vision.get(id(ex))))
        while play.open:
            groups.update((p.group_id, rollouts) for p, rollouts in play.advance())
    finally:
        play.close()
    return [groups[first_group_id + g] for g in range(len(prompts))]


def whole_batch_stream(engine: InferenceEngine, sampling: SamplingSettings, rows: int, max_len: int | None):
    """The stream whole batches are played in (nothing loads while it runs): the engine's own, except for
    engines whose servers load the weights (RemoteEngine, VLLMEngine), whose batches go through
    `generate` (BatchedStream: one request per prompt, each server's in order with data.deterministic)."""
    if engine.servers_load_weights:
        return BatchedStream(engine, sampling, rows)
    return engine.open_stream(sampling, rows, "continue", max_len)
