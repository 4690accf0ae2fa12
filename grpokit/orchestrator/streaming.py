"""Streaming rollouts (`data.streaming`): a fixed number of groups in flight in the engine, a new group
submitted as soon as one finishes, finished groups scored, filtered and handed to the batcher as they
finish, and new weights loaded between two decode steps while unfinished rollouts continue.

Whole-batch generation (the default, `data.streaming: null`) asks the engine for a step's groups and
waits for the slowest completion; the engine idles through that tail and through weight loads. Here
the engine holds up to `max_inflight` groups (AReaL's max_concurrent_rollouts) through a
GenerationStream (grpokit.inference.streams), and a step's batch is the first groups that finish and
pass `buffer.keep` (dynamic sampling), in the order they were submitted. What stays as in whole-batch
generation:

- Prompts come in the same blocks (`prompts.take(block)`, env ratios and easy/hard pools included),
  block b sampled with seed `sampling.seed * 1_000_003 + b` when it starts an idle stream, group ids
  `b * prompts_per_block + i`; too-long prompts are skipped and counted.
- The async bound: a group is submitted only while the engine's weights are at least
  `first_step - max_async_level` of the generation it will land in (counted from the groups ready and
  in flight, as AReaL counts its staleness), so with `max_async_level: 0` nothing is submitted for a
  step before its weights, and with `max_inflight` covering a step's prompts streaming samples exactly
  what whole-batch generation does. Groups finish out of order, so one that finishes after its step's
  batch was formed trains in the next, one step older than the bound: a batch takes the oldest ready
  groups first (by oldest token), and `max_off_policy_steps` is the hard limit.
- `max_off_policy_steps` drops a group by its oldest token (Rollout.policy_step is the oldest token's
  weight step; Rollout.token_steps has each token's).

New weights are polled before every decode step and loaded into the stream at once
(`on_update: continue`: unfinished rollouts continue with the new weights, their KV cache recomputed;
`regenerate`: they restart from their prompts). The losses use the engine's recorded logprob of each
token, so the importance ratio of a mixed-weight rollout compares each token with the weights that
sampled it (docs/orchestrator.md says which losses this is sound for).

Multi-turn tasks (tools, `respond`, verifiers toolsets) stream turn by turn: the first turn is the group's
request (n = G), then each conversation's next turn is a request of its own (n = 1, its ids so far as the
prompt), submitted as soon as the environment has answered (grpokit.orchestrator.multi_turn.take_turn,
the same budget and max_turns), so a short conversation does not wait for its group's long one; the
group is scored when its last conversation ends. verifiers Env episodes (grpokit.orchestrator.episodes)
stream the same way: a prompt's G episodes start when it is submitted, every role that waits for a
reply is a request of its own, and the episode's code runs on as each reply comes back; the group is
scored (the Env's finalize included) when its last episode ends. Not streamed (refused at start): a
temperature schedule. Not bit-reproducible on resume: the stream's decode interleaving depends on when
weights arrived.

timeline.jsonl gets a `group` span per group (submitted to finished, with its weight steps) and a
`weights` mark per update loaded, so `grpokit bench`'s and the docs' figures show the engine busy.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from grpokit.common.timeline import record_timeline
from grpokit.inference.streams import FinishedGroup, GroupRequest
from grpokit.orchestrator.chat_tokens import ChatTokens
from grpokit.orchestrator.conversation import Conversation, is_multi_turn
from grpokit.orchestrator.episodes import Episode, EpisodeLimits, EpisodeTable, Role
from grpokit.orchestrator.multi_turn import conversation_rollouts, take_turn
from grpokit.orchestrator.prompt_length import split_by_length
from grpokit.orchestrator.rollouts import sampled_group
from grpokit.orchestrator.toolsets import close_toolsets
from grpokit.types import Rollout

if TYPE_CHECKING:
    from grpokit.orchestrator.loop import RolloutLoop

log = logging.getLogger(__name__)


@dataclass
class StreamingSettings:
    """Streaming rollouts (grpokit.orchestrator.streaming).

    Args:
        max_inflight: groups in the engine at once; a new one is submitted as one finishes. The builtin
            engine decodes up to max_inflight x rollouts_per_example rows together.
        on_update: what unfinished rollouts do when new weights load between two decode steps:
            "continue" (partial rollouts: later tokens come from the new weights, each token records
            its weight step), "regenerate" (they restart from their prompts with the new weights), or,
            with a server engine (RemoteEngine, VLLMEngine), "finish" (they end on the weights they
            began with; the update applies to the groups sent after it).
    """

    max_inflight: int = 8
    on_update: Literal["continue", "regenerate", "finish"] = "continue"

    def __post_init__(self) -> None:
        if self.max_inflight < 1:
            raise ValueError(f"data.streaming.max_inflight must be >= 1 (groups in flight), got {self.max_inflight}")
        if self.on_update not in ("continue", "regenerate", "finish"):
            raise ValueError(f"data.streaming.on_update must be continue, regenerate or finish, got {self.on_update!r}")


@dataclass
class _Pending:
    env: object
    example: object
    prompt_ids: list[int]
    group_id: int
    seed: int
    submitted: float = 0.0


@dataclass
class _Conversations:
    """A multi-turn prompt's G conversations in the stream: each turn is a request of its own (n = 1, the
    conversation's ids as its prompt), and the environment answers between two (multi_turn.take_turn)."""

    pending: _Pending
    convs: list[Conversation]

    @property
    def open(self) -> int:
        return sum(not c.done for c in self.convs)

    def rollouts(self, tokenizer) -> list[Rollout]:
        close_toolsets(self.convs)
        return conversation_rollouts([self.convs], self.pending.group_id, tokenizer)[0]


@dataclass
class _Turn:
    """One conversation's next turn, as a stream request's key."""

    state: _Conversations
    conv: Conversation


@dataclass
class _Episodes:
    """A verifiers Env prompt's G episodes in the stream (grpokit.orchestrator.episodes); `asked`: the
    replies already requested (each waiting role's future)."""

    pending: _Pending
    episodes: list[Episode]
    asked: set = field(default_factory=set)


@dataclass
class _RoleTurn:
    """A waiting role's next reply, as a stream request's key."""

    state: _Episodes
    role: Role


class StreamingRollouts:
    """A RolloutLoop's groups, streamed (see the module docstring); `select_groups` replaces the loop's."""

    def __init__(self, loop: RolloutLoop, settings: StreamingSettings) -> None:
        self.loop, self.settings = loop, settings
        config = loop.config
        self.episodes: EpisodeTable | None = None  # verifiers Env episodes in play, made at the first one
        self.group_size = config.rollouts_per_example
        self.chat: ChatTokens | None = None  # for multi-turn prompts, made at the first one
        self.budget = min(config.seq_len, loop.engine.context_length() or config.seq_len)
        self.groups_inflight = 0  # prompts submitted whose group has not finished (every turn of it)
        self.stream = loop.engine.open_stream(  # a row holds the trained budget
            config.sampling, settings.max_inflight * self.group_size, settings.on_update, self.budget
        )
        self.prompts: deque[_Pending] = deque()
        self.next_block: int | None = None
        self.ready: list[list[Rollout]] = []  # finished groups that passed buffer.keep, not yet handed out
        self.dropped: list[list[Rollout]] = []  # finished groups buffer.keep refused, since the last hand-out
        self.too_long = 0
        self.generation = 0

    def select_groups(self, generation: int) -> tuple[list[list[Rollout]], list[list[Rollout]], int]:
        """(the generation's groups and those buffer.keep refused since the last call, the generation's
        groups to train on in submission order, the prompts skipped as too long), streaming until enough
        groups have passed. Groups that finish past what a generation needs wait for the next one."""
        loop = self.loop
        needed = loop.shape.prompts_per_step * loop.shape.steps_per_generation
        self.generation = generation
        if self.next_block is None:
            self.next_block = generation * loop.config.buffer.rounds
        idle_since = None
        while len(self.ready) < needed:
            if loop.stopping.is_set():
                raise RuntimeError("orchestrator stopped while streaming rollouts")
            self._poll_weights()
            self._submit(needed)
            if self.groups_inflight == 0:  # nothing may start yet: waiting for weights
                idle_since = idle_since or time.monotonic()
                self._check_wait(idle_since)
                time.sleep(0.05)
                continue
            idle_since = None
            self._collect(self.stream.advance())
        self.ready.sort(key=lambda g: (min(r.policy_step for r in g), g[0].group_id))  # the oldest first
        kept, self.ready = sorted(self.ready[:needed], key=lambda g: g[0].group_id), self.ready[needed:]
        generated = sorted(kept + self.dropped, key=lambda g: g[0].group_id)  # what the step's metrics describe
        too_long, self.dropped, self.too_long = self.too_long, [], 0
        return generated, kept, too_long

    def close(self) -> None:
        self.stream.close()
        if self.episodes is not None:
            self.episodes.close()

    # --- one pass of the loop ----------------------------------------------------------------------

    def _poll_weights(self) -> None:
        loop = self.loop
        update = loop.weights.poll(loop.engine.weight_step)
        if update is not None:
            start = time.time()
            self.stream.load_weights(update)
            record_timeline(loop.run_dir, "weights", update.step, start, time.time(), inflight=self.stream.inflight)

    def _submit(self, needed: int) -> None:
        """Fill the stream up to max_inflight with groups whose generation the weights allow."""
        loop, config = self.loop, self.loop.config
        while self.groups_inflight < self.settings.max_inflight:
            target = self.generation + (len(self.ready) + self.groups_inflight) // needed
            first_step = target * loop.shape.steps_per_rollout_generation
            if loop.engine.weight_step < max(0, first_step - config.max_async_level):  # as wait_for_weights
                return
            pending = self._next_prompt()
            pending.submitted = time.time()
            self.groups_inflight += 1
            if getattr(pending.env, "episode_env", None) is not None:
                self._start_episodes(pending)
            else:
                self.stream.submit(GroupRequest(pending, pending.prompt_ids, self.group_size, pending.seed))

    def _next_prompt(self) -> _Pending:
        """The next prompt to submit, from the next block when this one is used up (as whole-batch
        generation draws, seeds and numbers them)."""
        loop = self.loop
        per_block = loop.prompts_per_block()
        while not self.prompts:
            block = self.next_block
            self.next_block += 1
            prompts, ids, skipped = split_by_length(
                loop.tokenizer, loop.prompts.take(block, per_block), loop.prompt_limit
            )
            self.too_long += skipped
            seed = loop.block_seed(block)
            for g, ((env, ex), prompt_ids) in enumerate(zip(prompts, ids)):
                self.prompts.append(_Pending(env, ex, prompt_ids, block * per_block + g, seed))
        return self.prompts.popleft()

    def _collect(self, finished: list[FinishedGroup]) -> None:
        """Score the groups that finished; a multi-turn group's finished turns go on to the next."""
        loop = self.loop
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
                    self._finished(key.state.pending, key.state.rollouts(loop.tokenizer))
            elif is_multi_turn(key.example.task, getattr(key.example, "toolsets", None)):
                self._start_conversations(key, group.completions)
            else:
                rollouts = sampled_group(
                    key.env, key.example, key.prompt_ids, group.completions, key.group_id, loop.tokenizer
                )
                self._finished(key, rollouts)

    def _start_conversations(self, p: _Pending, completions: list) -> None:
        """A multi-turn prompt's first turn finished: G conversations, each continuing on its own."""
        self.chat = self.chat or ChatTokens(self.loop.tokenizer)
        state = _Conversations(p, [Conversation.opening(p.env, p.example, p.prompt_ids) for _ in completions])
        for conv, completion in zip(state.convs, completions):
            take_turn(conv, completion, *self._turn_args())
            if not conv.done:
                self._next_turn(state, conv)
        if not state.open:
            self._finished(p, state.rollouts(self.loop.tokenizer))

    def _start_episodes(self, p: _Pending) -> None:
        """An Env-episode prompt: its G episodes start, and play until they wait for replies."""
        if self.episodes is None:
            loop, config = self.loop, self.loop.config
            # every role's turns go through the one stream: a fixed cache (the fast path's) bounds them all
            context = min(loop.engine.context_length() or sys.maxsize, self.stream.max_len or sys.maxsize)
            limits = EpisodeLimits(config.sampling.max_tokens, self.budget, config.max_turns, context)
            self.episodes = EpisodeTable(loop.tokenizer, limits)
        self._play(_Episodes(p, self.episodes.start(p.env, p.example, self.group_size)))

    def _play(self, state: _Episodes) -> None:
        """Run the episodes' code on; a role newly waiting for a reply becomes a request, and a group whose
        episodes have all ended is scored."""
        for role in self.episodes.settle(state.episodes):
            if role.waiting not in state.asked:
                state.asked.add(role.waiting)
                self.stream.submit(GroupRequest(_RoleTurn(state, role), role.conv.prompt_ids + role.conv.ids, 1))
        if all(ep.handle.done() for ep in state.episodes):
            convs, scores = self.episodes.finish(state.episodes)
            p = state.pending
            self._finished(p, conversation_rollouts([convs], p.group_id, self.loop.tokenizer, [scores])[0])

    def _next_turn(self, state: _Conversations, conv: Conversation) -> None:
        self.stream.submit(GroupRequest(_Turn(state, conv), conv.prompt_ids + conv.ids, 1))

    def _turn_args(self) -> tuple:
        config = self.loop.config
        return self.loop.tokenizer, self.chat, self.budget, config.sampling.max_tokens, config.max_turns

    def _finished(self, p: _Pending, rollouts: list[Rollout]) -> None:
        """A group is complete: pools, dynamic sampling, the timeline."""
        loop, config = self.loop, self.loop.config
        self.groups_inflight -= 1
        rewards = [r.reward for r in rollouts]
        if loop.pools is not None:
            loop.pools.observe(self.generation, loop.prompts.key_of(p.env, p.example), sum(rewards) / len(rewards))
        (self.ready if config.buffer.keep(rewards) else self.dropped).append(rollouts)
        steps = [s for r in rollouts for s in (r.token_steps or [r.policy_step])]
        record_timeline(
            loop.run_dir,
            "group",
            self.generation,
            p.submitted,
            time.time(),
            group_id=p.group_id,
            first_weights=min(steps),
            last_weights=max(steps),
        )

    def _check_wait(self, since: float) -> None:
        config = self.loop.config
        timeout = config.weights_timeout or config.timeout
        if time.monotonic() - since > timeout:
            key = "data.weights_timeout" if config.weights_timeout else "data.timeout"
            raise TimeoutError(
                f"streaming rollouts: no weights new enough for the next group after {timeout:.0f}s ({key}); "
                "is the trainer publishing through the same broadcast?"
            )
