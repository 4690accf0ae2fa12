"""The rollout driver: the one producer of every generation's groups, whole-batch and streamed.

Groups are played in a GenerationStream (grpokit.orchestrator.group_play: single-turn, multi-turn and
verifiers Env episodes alike); what differs between the two modes is only when prompts are admitted:

- **Whole-batch** (`data.streaming: null`, the default): a generation's block of prompts is admitted at
  once into an idle stream and played to its end; weights load only while the stream is idle, before
  the generation starts. Admitted together into an idle stream and seeded with the block's seed, the
  builtin engine's stream samples exactly what `generate` samples (grpokit.inference.streams). With
  `buffer` resampling rounds, each round is another block, until enough groups pass `buffer.keep`.
- **Streaming** (`data.streaming`): up to `max_inflight` groups (AReaL's max_concurrent_rollouts) in
  the engine, a new one submitted as one finishes; a step's batch is the first groups that finish and
  pass `buffer.keep` (dynamic sampling), the oldest first; unfinished rollouts continue across weight
  updates (`on_update`).

Written once for both:
- Prompts come in blocks (`prompts.take(block)`, env ratios and easy/hard pools included), block b
  sampled with seed `sampling.seed * 1_000_003 + b` when it starts an idle stream, group ids
  `b * prompts_per_block + i` (a prompt's position in the data order); too-long prompts are skipped and
  counted. grpokit.orchestrator.accounting records where every position went; a resumed stream
  continues at the first position no earlier step accounted for (`resume`), not at its generation's
  block: a killed stream had drawn ahead, and its prompts in flight were never trained.
- The async bound and the weights (grpokit.orchestrator.weights.WeightSchedule): a group is submitted
  only once the engine holds the weights of the generation it will land in (counted from the groups
  ready and in flight, as AReaL counts its staleness). With `data.deterministic` (the default) that is
  exactly the scheduled step, loaded at the first submission that needs it, so where an update enters a
  running stream is fixed by the counts of groups submitted and handed out, not by timing. So with
  `max_async_level: 0` and `max_inflight` covering a step's prompts, streaming samples exactly what
  whole-batch generation does. A group that finishes after its step's batch was formed trains in the
  next, one step older than the bound: `max_off_policy_steps` (by a group's oldest token) is the limit.
- `buffer.keep` and the easy/hard pools see every finished group once; timeline.jsonl gets a `group`
  span per group (submitted to finished, with its weight steps) and a `weights` mark per update.

Not streamed (refused at start): a temperature schedule. Whole-batch generation opens a stream per
temperature when a schedule changes it. Server engines (RemoteEngine, VLLMEngine) play whole batches
through `generate` (grpokit.inference.streams.BatchedStream), whose requests go to each server in order.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import replace
from typing import TYPE_CHECKING

from grpokit.common.errors import RunDataError
from grpokit.common.timeline import record_timeline
from grpokit.judges import dropped_by_judge
from grpokit.orchestrator.group_play import GroupPlay, PendingGroup, whole_batch_stream
from grpokit.orchestrator.prompt_length import split_by_length
from grpokit.orchestrator.streaming import StreamingSettings
from grpokit.types import Rollout

if TYPE_CHECKING:
    from grpokit.orchestrator.loop import RolloutLoop

Groups = list[list[Rollout]]


class RolloutDriver:
    """A RolloutLoop's groups, generation by generation (see the module docstring)."""

    def __init__(self, loop: RolloutLoop, streaming: StreamingSettings | None) -> None:
        self.loop, self.streaming = loop, streaming
        settings = loop.settings
        self.group_size = settings.rollouts_per_example
        self.needed = loop.shape.prompts_per_step * loop.shape.steps_per_generation
        self.budget = min(settings.seq_len, loop.engine.context_length() or settings.seq_len)
        self.max_inflight = streaming.max_inflight if streaming is not None else loop.prompts_per_block()
        self.play: GroupPlay | None = None
        self.temperature: float | None = None  # the open stream's
        self.prompts: deque[PendingGroup] = deque()
        self.next_block: int | None = None
        self.ready: Groups = []  # finished groups that passed buffer.keep, not yet handed out
        self.dropped: Groups = []  # finished groups buffer.keep refused, since the last hand-out
        self.too_long = 0
        self.blocks_without_prompt = 0  # consecutive prompt blocks whose every prompt was too long
        self.generation = 0
        self.inflight: set[int] = set()  # positions (group ids) submitted, not finished
        self.skipped: dict[str, list[int]] = {}  # too_long / unused_round positions since the last hand-out
        self.resumed: set[int] | None = None  # streaming resume: positions earlier steps accounted for

    def select_groups(self, generation: int) -> tuple[Groups, Groups, int]:
        """(every group finished for `generation` since the last hand-out, the groups it trains on in
        submission order, the prompts skipped as too long)."""
        self.generation = generation
        self._open(self.loop.temperature(generation))
        if self.streaming is None:
            return self._whole_generation(generation)
        return self._streamed_generation(generation)

    def load(self, update) -> None:
        """Load `update` into the engine through the open stream (its unfinished rows continue or restart
        with it), and mark it on the timeline."""
        start, stream = time.time(), self.play.stream if self.play is not None else None
        (stream.load_weights if stream is not None else self.loop.engine.load_weights)(update)
        inflight = stream.inflight if stream is not None else 0
        record_timeline(self.loop.run_dir, "weights", update.step, start, time.time(), inflight=inflight)

    def resume(self, accounted: set[int]) -> None:
        """Streaming: continue at the first position no earlier step accounted for, skipping the later ones
        that were (a killed stream had drawn ahead; the prompts it had in flight are drawn again)."""
        if self.streaming is not None:
            self.resumed = accounted

    def take_skipped(self) -> dict[str, list[int]]:
        """The positions skipped as too long or in unused rounds since the last call (prompts.jsonl)."""
        skipped, self.skipped = self.skipped, {}
        return {rule: positions for rule, positions in skipped.items() if positions}

    def leftover(self) -> list[int]:
        """Positions drawn and not handed out: in flight, finished and waiting, or queued (the run's end)."""
        waiting = [g[0].group_id for g in self.ready + self.dropped] + [p.group_id for p in self.prompts]
        return sorted(self.inflight | set(waiting))

    def _first_block(self) -> int:
        """The block a stream starts at: its generation's first, or on a resume the one holding the first
        position that no earlier step accounted for."""
        if self.resumed is None:
            return self.generation * self.loop.settings.buffer.rounds
        first = next(p for p in itertools.count() if p not in self.resumed)
        return first // self.loop.prompts_per_block()

    def close(self) -> None:
        if self.play is not None:
            self.play.close()
            self.play = None

    # --- the two admissions ----------------------------------------------------------------------

    def _whole_generation(self, generation: int) -> tuple[Groups, Groups, int]:
        """Each round's block admitted whole into the idle stream and played to its end, until enough
        groups pass buffer.keep or the rounds are used up (as many as a generation reserves)."""
        loop = self.loop
        generated, kept, too_long = [], [], 0
        for round_ in range(loop.settings.buffer.rounds):
            block, skipped = self._block(generation * loop.settings.buffer.rounds + round_)
            too_long += skipped
            for pending in block:
                self._submit(pending)
            while self.play.open:
                self._check_stopping()
                self._finish_all(self.play.advance())
            generated += sorted(self.ready + self.dropped, key=lambda g: g[0].group_id)
            kept += sorted(self.ready, key=lambda g: g[0].group_id)
            self.ready, self.dropped = [], []
            if len(kept) >= self.needed:
                per_block, rounds = loop.prompts_per_block(), loop.settings.buffer.rounds
                first, end = (generation * rounds + round_ + 1) * per_block, (generation + 1) * rounds * per_block
                self.skipped.setdefault("unused_round", []).extend(range(first, end))  # reserved, never drawn
                break
        if not generated and too_long:  # nothing to train on or describe: one line naming the keys
            raise RunDataError(self._none_fits(f"generation {generation}: all {too_long} prompts"))
        return generated, kept[: self.needed], too_long

    def _streamed_generation(self, generation: int) -> tuple[Groups, Groups, int]:
        """Stream until enough groups have passed; those past what a generation needs wait for the next."""
        loop, needed = self.loop, self.needed
        while len(self.ready) < needed:
            self._check_stopping()
            if not loop.schedule.deterministic:  # the newest weights, between any two decode steps
                loop.schedule.poll(loop.engine.weight_step + 1, self.load)
            self._fill()
            self._finish_all(self.play.advance())
        self.ready.sort(key=lambda g: (min(r.policy_step for r in g), g[0].group_id))  # the oldest first
        kept, self.ready = sorted(self.ready[:needed], key=lambda g: g[0].group_id), self.ready[needed:]
        generated = sorted(kept + self.dropped, key=lambda g: g[0].group_id)  # what the step's metrics describe
        too_long, self.dropped, self.too_long = self.too_long, [], 0
        return generated, kept, too_long

    def _fill(self) -> None:
        """Fill the stream up to max_inflight with groups whose generation the weights allow.

        Deterministic schedule: the weights a group needs load exactly when the first group that needs
        them is submitted, a point fixed by the counts of groups submitted and handed out, never by when
        the trainer published them: the stream waits there (no decode step) if the trainer is late and
        can deliver without another batch; otherwise submitting stops until this generation's batch is
        handed out. Not deterministic: the groups in flight decode on while the weights are missing, and
        the stream waits only once nothing is in flight. Either way the stream never returns empty."""
        loop = self.loop
        schedule = loop.schedule
        while self.play.open < self.max_inflight:
            target = self.generation + (len(self.ready) + self.play.open) // self.needed
            step = schedule.needed(target)
            if loop.engine.weight_step < step:
                may_wait = schedule.deterministic and schedule.deliverable(step, self.generation)
                if not may_wait and self.play.open:
                    return
                schedule.wait(step, loop.stopping, loop.announce, self.load)
            while not self.prompts:
                if self.next_block is None:
                    self.next_block = self._first_block()
                block, skipped = self._block(self.next_block)
                self.next_block, self.too_long = self.next_block + 1, self.too_long + skipped
                self.prompts.extend(block)
            self._submit(self.prompts.popleft())

    # --- prompts in, groups out --------------------------------------------------------------------

    def _block(self, block: int) -> tuple[list[PendingGroup], int]:
        """The prompts of prompt block `block` (numbered and seeded as above), and how many were skipped as
        too long."""
        loop = self.loop
        per_block = loop.prompts_per_block()
        items = loop.prompts.take(block, per_block)
        usable, ids, vision = items, None, {}
        if loop.images is not None:  # prompts with images: rendered by the processor, bad images left out
            usable, ids, vision = loop.images.render_all(items)
        warn = max(0, 3 - self.too_long)
        prompts, ids, skipped = split_by_length(loop.tokenizer, usable, loop.prompt_limit, warn=warn, ids=ids)
        self._check_some_prompt_fits(bool(prompts), per_block)
        seed = loop.block_seed(block)
        first, places = block * per_block, fitting_places(items, prompts)
        bad = {first + i for i in set(range(len(items))) - set(fitting_places(items, usable))}
        too_long = sorted(set(range(first, first + len(items))) - {first + i for i in places} - bad)
        for rule, positions in (("too_long", too_long), ("bad_image", sorted(bad))):
            self.skipped.setdefault(rule, []).extend(p for p in positions if p not in (self.resumed or ()))
        pending = [
            PendingGroup(env, ex, p, first + i, seed, vision=vision.get(id(ex)))
            for i, (env, ex), p in zip(places, prompts, ids)
        ]
        if self.resumed:  # a resumed stream: what earlier steps accounted for is not drawn again
            pending = [p for p in pending if p.group_id not in self.resumed]
        return pending, skipped

    def _check_some_prompt_fits(self, any_fit: bool, per_block: int) -> None:
        """Stop the run once a whole pass over the data has had no prompt that fits: a stream skipping on
        would draw blocks forever. (A whole-batch generation stops sooner: when none of its prompts fit.)"""
        self.blocks_without_prompt = 0 if any_fit else self.blocks_without_prompt + 1
        loop = self.loop
        if self.blocks_without_prompt >= loop.prompts.blocks_per_pass(per_block):
            count = self.blocks_without_prompt * per_block
            raise RunDataError(self._none_fits(f"{count} prompts in a row (a pass over the data)"))

    def _none_fits(self, which: str) -> str:
        return (
            f"no prompt of data.env fits: {which} have more than {self.loop.prompt_limit} tokens "
            "(data.max_prompt_tokens, or data.seq_len / the model's context minus data.sampling.max_tokens, "
            "the chat template included): raise data.seq_len or data.max_prompt_tokens, or lower "
            "data.sampling.max_tokens"
        )

    def _submit(self, pending: PendingGroup) -> None:
        pending.submitted = time.time()
        self.inflight.add(pending.group_id)
        self.play.submit(pending)

    def _finish_all(self, completed: list[tuple[PendingGroup, list[Rollout]]]) -> None:
        """Completed groups: the pools, dynamic sampling (buffer.keep), the timeline."""
        loop, keep = self.loop, self.loop.settings.buffer.keep
        for p, rollouts in completed:
            self.inflight.discard(p.group_id)
            rewards = [r.reward for r in rollouts]
            if loop.pools is not None:
                loop.pools.observe(self.generation, loop.prompts.key_of(p.env, p.example), sum(rewards) / len(rewards))
            (self.ready if keep(rewards) and not dropped_by_judge(rollouts) else self.dropped).append(rollouts)
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

    def _open(self, temperature: float) -> None:
        """The stream at this generation's temperature (a schedule changes it between whole batches)."""
        if self.play is not None and self.temperature == temperature:
            return
        self.close()
        loop = self.loop
        sampling = replace(loop.settings.sampling, temperature=temperature)
        rows = self.max_inflight * self.group_size
        if self.streaming is None:
            stream = whole_batch_stream(loop.engine, sampling, rows, self.budget)  # a row holds the budget
        else:
            stream = loop.engine.open_stream(sampling, rows, self.streaming.on_update, self.budget)
        self.play = GroupPlay(stream, loop.engine, loop.tokenizer, self.group_size, loop.turns)
        self.temperature = temperature

    def _check_stopping(self) -> None:
        if self.loop.stopping.is_set():
            raise RuntimeError("orchestrator stopped while sampling rollouts")


def fitting_places(items: list, fitting: list) -> list[int]:
    """The index in `items` of each of `fitting` (an order-kept subsequence of it, as split_by_length
    returns): a prompt's place in its block, so a group's id is its position in the data order even
    when prompts before it were too long."""
    places, i = [], 0
    for env, ex in fitting:
        while items[i][0] is not env or items[i][1] is not ex:
            i += 1
        places.append(i)
        i += 1
    return places
