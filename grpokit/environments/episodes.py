"""verifiers environments with an episode of their own (`vf.Env.run(task, agents)`: a simulated user, a
game master, several agents), played by grpokit's engine.

verifiers' multi-agent surface is an `Env` subclass whose `run(task, agents)` drives one episode: it
opens `agents.<role>.interaction(task)` and sends turns (`segment = await interaction.turn(message)`),
each answered by that role's model. grpokit hands `run` agents of its own (EpisodeAgents): every role is
played by the policy's engine, and each `turn` waits for the next batched `generate`, which answers the
waiting turns of every episode of the step at once, as grpokit's own multi-turn loop does
(grpokit.environments.multi_turn). `run` keeps its control flow; verifiers' harnesses, sandboxes and
model clients are not involved, so it runs offline, and every reply's tokens are the engine's.

One role is trained: the one still `trainable` after the Env's `setup` (user-sim sets
`agents.user.trainable = False`). Its conversation is the rollout, token-faithful: the first prompt
rendered from its first messages, each later turn's messages rendered as a suffix after the engine's
tokens (grpokit.environments.chat_tokens, mask 0, no logprobs), each reply the engine's tokens. The other
roles are played by the same engine, untrained (self-play, a simulated user); their chats go to the
Env's `finalize`.

Limits: a role's turns stop at its AgentConfig.max_turns (else data.max_turns) and at the budget (its
prompt and turns within data.seq_len and the engine's context). The turn past either gets a
`terminated` Segment, as verifiers' does when a run ends, and a trained conversation stopped by the
budget is marked truncated. A reply cut at max_tokens ends its role's exchange (truncated).

Scoring: each role's chat becomes a verifiers Trace (agent name and trainable stamped), scored by its
task's rubric (`task.score`); then the Env's `finalize(task, episode)` sees every trace and may record
more rewards and metrics. The trained trace gives the rollout's reward, checked as every reward is.

Images: a role whose first messages hold image parts (the task's prompt, e.g. a taskset of pictures) has
its prompt rendered by the policy's processor (image_turns.ImageTurns.render_prompt), as the driver renders
one (grpokit.orchestrator.image_prompts). A later `turn()` message may hold image parts (`image_url`,
`image`: grpokit.vision.messages), even after a text prompt: rendered as grpokit's own loop renders
`respond`'s and tools' pictures (image_turns.render_turn: the processor's suffix after the reply, mask 0),
they join the role's conv.vision, so every later reply is sampled with every picture so far and the trained
rollout carries them to the trainer. data.pixel_budget holds (max_images counts the role's pictures); a
text-only policy, or a picture that cannot be used, stops the run naming environment, example and role.

Not provided: tools inside an episode (a segment is one reply), `Interaction.send` and `steer`, more
than one trainable role; each is an error naming the environment when used.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import time
from dataclasses import dataclass
from typing import Any

from grpokit.environments.chat_tokens import ChatTokens
from grpokit.environments.conversation import Conversation, is_turn_content, over_budget
from grpokit.environments.environment import make_chat_trace, prompt_messages
from grpokit.environments.finish import record_finish_reasons
from grpokit.environments.image_turns import TURN_PICTURE, render_turn
from grpokit.environments.tool_images import portable_parts
from grpokit.environments.workers import ToolPool
from grpokit.vision.messages import has_images, split_images

SETTLE_TIMEOUT = 300.0  # seconds an episode's own code may run between two turns
BLOCKED_GRACE = 10.0  # past SETTLE_TIMEOUT: the event loop itself is blocked by a synchronous call


@dataclass
class EpisodeLimits:
    """What bounds a role's exchange: `max_tokens` per reply, `max_turns` replies (a role's
    AgentConfig.max_turns wins), and in all `budget` tokens for the trained role (it is packed into
    data.seq_len) and `context` tokens (the engine's) for the others."""

    max_tokens: int
    budget: int
    max_turns: int
    context: int


class Role:
    """One role's exchange in an episode (what `agent.interaction(task)` yields): its conversation, and the
    turn it waits on while the engine writes the reply."""

    def __init__(self, episode: Episode, agent: EpisodeAgent, task: Any) -> None:
        self.episode, self.agent, self.task = episode, agent, task
        self.conv = Conversation(episode.env, episode.example, [], prompt_messages(task.data))
        self.num_prompt_messages = len(self.conv.messages)
        self.prompted = task.data.prompt is not None
        self.max_turns = int(getattr(agent.config, "max_turns", None) or episode.limits.max_turns)
        self.started = False
        self.over = False  # the exchange has ended: the next turn gets a terminated Segment
        self.ended = False  # the terminated Segment was delivered
        self.waiting: asyncio.Future | None = None
        self._last_reply: list[int] = []

    @property
    def trace(self):
        """The exchange so far as a verifiers Trace."""
        trace = make_chat_trace(self.task, self.conv.messages, self.num_prompt_messages)
        record_finish_reasons(trace, self.conv.finish_reasons)  # each reply's, as grpokit's own rubrics see them
        trace.agent.name, trace.agent.trainable = self.agent.name, self.agent.trainable
        return trace

    async def turn(self, message: Any = None):
        """Send `message` (a str, or a list of messages) and return the role's reply as a verifiers
        Segment; a bare turn() takes a prompted task's opening reply (verifiers' rules)."""
        from verifiers.v1.agent import Segment

        if self.ended:
            raise RuntimeError(f"{self._where()}: the exchange is over (the run ended); read interaction.trace")
        prompted = not self.started and self.prompted
        if message is None and not prompted:
            raise ValueError(f"{self._where()}: turn() needs the next user message (the task has no prompt to open)")
        if message is not None and prompted:
            raise ValueError(f"{self._where()}: the task's prompt opens this exchange: take its reply with turn()")
        self.started = True
        new = self._messages(message)
        if self.over or self.conv.turns >= self.max_turns or not self._extend(new):
            self.ended = True
            return Segment(messages=[], terminated=True)
        self.waiting = asyncio.get_running_loop().create_future()
        completion = await self.waiting
        self.waiting = None
        text = self.episode.tokenizer.decode(completion.token_ids, skip_special_tokens=True)
        self.conv.add_completion(completion, text)
        self.conv.turn_rewards.append(None)
        self._last_reply = completion.token_ids
        if completion.finish_reason != "stop":  # cut at max_tokens, or aborted: the exchange ends
            self.over, self.conv.is_truncated = True, completion.is_truncated
        return Segment(messages=[_vf().AssistantMessage(content=text)])

    def _extend(self, new: list[dict[str, Any]]) -> bool:
        """Add the turn's messages (and their tokens) to the conversation, or end it at the budget."""
        limits, chat = self.episode.limits, self.episode.chat
        budget = limits.budget if self.agent.trainable else limits.context
        if not self.conv.prompt_ids:  # the first reply: the prompt is rendered from the messages so far
            messages = self.conv.messages + new
            ids = self._prompt_ids(messages)
            if len(ids) + limits.max_tokens > budget:
                raise ValueError(
                    f"{self._where()}: the first prompt has {len(ids)} tokens, no room for "
                    f"data.sampling.max_tokens ({limits.max_tokens}) within {budget} (data.seq_len or the "
                    "model's context); raise data.seq_len or shorten the environment's opening messages"
                )
            self.conv.messages, self.conv.prompt_ids = messages, ids
            self.num_prompt_messages = len(messages)
            return True
        room = budget - self.conv.num_tokens - limits.max_tokens
        if over_budget(self.conv, chat, new, room):  # too long to fit, told before rendering: logged, counted
            self.over = self.conv.is_truncated = True
            return False
        images, held = self.episode.images, len(split_images(self.conv.messages)[1])  # its pictures so far
        env_ids, vision, count = render_turn(images, self._where(), chat, self._last_reply, new, held, TURN_PICTURE)
        if len(env_ids) > room:
            self.over = self.conv.is_truncated = True
            return False
        self.conv.add_environment(env_ids, new, vision, count)  # its pictures join the role's conv.vision
        return True

    def _prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """The first prompt's ids: the tokenizer's chat template, or, when the messages hold images, the
        processor's (the role's image inputs kept in conv.vision, sent with each of its requests)."""
        if not has_images(messages):
            return self.episode.chat.prompt(messages)
        images = self.episode.images
        if images is None:
            raise ValueError(f"{self._where()}: the prompt holds images, which this caller cannot render")
        ids, self.conv.vision = images.render_prompt(self._where(), messages)
        return ids

    def _messages(self, message: Any) -> list[dict[str, Any]]:
        """The turn's messages as dicts; a content is a str, or text and image parts holding an image (one
        held as a PIL image or bytes becomes a PNG data: URL part, so the chat stays JSON, as respond's)."""
        if message is None:
            return []
        items = [{"role": "user", "content": message}] if isinstance(message, str) else list(message)
        out = []
        for m in items:
            m = m if isinstance(m, dict) else m.model_dump(exclude_none=True)
            if not isinstance(m.get("role"), str) or not is_turn_content(m.get("content")):
                raise TypeError(
                    f"{self._where()}: turn() got the message {m!r:.200}; give a str role and a str content, or a "
                    "list of text and image parts holding an image (docs/vision.md)"
                )
            out.append({"role": m["role"], "content": portable_parts(m["content"], self._where())})
        return out

    async def send(self, *args, **kwargs):
        raise NotImplementedError(f"{self._where()}: Interaction.send is not provided by grpokit; use turn()")

    steer = send

    def _where(self) -> str:
        ep = self.episode
        return f"environment {ep.env.name!r} example {ep.example.index} role {self.agent.name!r}"


class EpisodeAgent:
    """A role of the Env's config, played by grpokit's engine (`trainable` as the Env's setup leaves it)."""

    def __init__(self, episode: Episode, name: str, config: Any) -> None:
        self.name, self.config, self.trainable = name, config, True
        self._episode = episode

    @contextlib.asynccontextmanager
    async def interaction(self, task: Any, **_ignored):
        """The role's exchange on `task` (verifiers' `runtime`, `tools` and `on_trace` do not apply)."""
        role = Role(self._episode, self, task)
        self._episode.roles.append(role)
        try:
            yield role
        finally:
            role.over = role.ended = True

    async def run(self, task: Any, **_ignored):
        """One reply to a prompted task, as verifiers' single-segment `Agent.run`; returns its Trace."""
        async with self.interaction(task) as role:
            await role.turn()
        return role.trace


class EpisodeAgents:
    """The Env config's roles by attribute (`agents.user`), as verifiers' Agents."""

    def __init__(self, episode: Episode, config: Any) -> None:
        from verifiers.v1.configs.agent import agent_config_fields

        self._agents = {name: EpisodeAgent(episode, name, cfg) for name, cfg in agent_config_fields(config).items()}

    def __getattr__(self, name: str) -> EpisodeAgent:
        agents = self.__dict__.get("_agents")
        if agents is None or name not in agents:
            raise AttributeError(f"no agent {name!r}; this config declares {sorted(agents or [])}")
        return agents[name]

    def __iter__(self):
        return iter(self._agents.values())


class Episode:
    """One run of the Env on one example: its roles, and the asyncio task running `setup` and `run`."""

    def __init__(self, env, example, tokenizer, chat: ChatTokens, limits: EpisodeLimits, images=None) -> None:
        self.env, self.example, self.tokenizer, self.chat, self.limits = env, example, tokenizer, chat, limits
        self.images = images  # ImageTurns: renders a role's prompt with images (None: text prompts only)
        self.agents = EpisodeAgents(self, env.episode_env.config)
        self.roles: list[Role] = []
        self.handle: asyncio.Task | None = None
        self.env_time = 0.0  # its share of the time its code ran (EpisodeTable.settle)

    async def play(self) -> None:
        await self.env.episode_env.setup(self.agents)
        await self.env.episode_env.run(self.example.task, self.agents)

    def waiting(self) -> list[Role]:
        return [r for r in self.roles if r.waiting is not None and not r.waiting.done()]

    def parked(self) -> bool:
        return self.handle.done() or bool(self.waiting())

    def trained(self) -> Role:
        """The exchange of the episode's trainable role: exactly one."""
        trained = [r for r in self.roles if r.agent.trainable]
        if len(trained) != 1 or not trained[0].conv.turns:
            names = sorted({a.name for a in self.agents if a.trainable})
            raise ValueError(
                f"environment {self.env.name!r} example {self.example.index}: grpokit trains one exchange per "
                f"episode, of the one trainable role, with at least one reply; the trainable roles {names} "
                f"opened {len(trained)} with {[r.conv.turns for r in trained]} replies (set the other roles' "
                "`trainable = False` in the Env's setup)"
            )
        return trained[0]

    def failure(self) -> BaseException | None:
        if self.handle is None or not self.handle.done() or self.handle.cancelled():
            return None
        return self.handle.exception()


class EpisodeTable:
    """Episodes in play on one asyncio event loop: `start` a prompt's episodes, `settle` them (run their
    code until each has ended or waits for a reply), answer the waiting roles, `finish` a prompt's group
    (scored). grpokit.orchestrator.group_play answers each waiting role as its request comes back."""

    def __init__(self, tokenizer, limits: EpisodeLimits, images=None) -> None:
        self.tokenizer, self.limits, self.chat = tokenizer, limits, ChatTokens(tokenizer)
        self.images = images  # ImageTurns, for roles whose prompt holds images
        self.loop = asyncio.new_event_loop()
        self.runner = ToolPool(1, "env-episodes")  # a daemon thread: a hung Env.run never blocks exit
        self.blocked = False  # the loop's thread was given up on, still inside an episode's code

    def start(self, env, example, count: int) -> list[Episode]:
        episodes = [Episode(env, example, self.tokenizer, self.chat, self.limits, self.images) for _ in range(count)]
        for ep in episodes:
            ep.handle = self.loop.create_task(ep.play())
        return episodes

    def settle(self, episodes: list[Episode]) -> list[Role]:
        """Run the episodes' code until each has ended or waits; the roles waiting for a reply. Their
        code runs interleaved: each episode is charged an equal share of the time (Conversation.env_time)."""
        start = time.perf_counter()
        self._run(_settle(episodes), episodes)
        for ep in episodes:
            ep.env_time += (time.perf_counter() - start) / len(episodes)
        return [role for ep in episodes for role in ep.waiting()]

    def finish(self, episodes: list[Episode]) -> tuple[list[Conversation], list[tuple[float, dict[str, float]]]]:
        """One prompt's ended episodes: their trained conversations and (reward, metrics), checked."""
        trained = [ep.trained() for ep in episodes]  # exactly one trained exchange each, checked before scoring
        outcomes = self._run(_score_all(episodes), episodes)
        for ep, role in zip(episodes, trained):
            role.conv.env_time = ep.env_time
        env, example = episodes[0].env, episodes[0].example
        scores = env.checked_scores([example] * len(episodes), [t for t, _ in outcomes], [o for _, o in outcomes])
        return [role.conv for role in trained], scores

    def _run(self, work, episodes: list[Episode]):
        """Run the loop until `work` is done, on the runner's thread: code that awaits forever is stopped
        by `_settle`'s own deadline, and a synchronous call in an Env's code that never returns (which
        blocks the loop, so no deadline inside it can fire) by this wait's, naming the environment. The
        loop runs only inside this call, so the orchestrator's thread may touch its futures in between."""
        if self.blocked:
            work.close()
            raise RuntimeError("the Env episodes' event loop is still blocked by an earlier call that never returned")
        future = self.runner.submit(self.loop.run_until_complete, work)
        try:
            return future.result(timeout=SETTLE_TIMEOUT + BLOCKED_GRACE)
        except concurrent.futures.TimeoutError:
            self.runner.abandon(future)
            self.blocked = True
            raise TimeoutError(
                f"environment {episodes[0].env.name!r}: the code of the episodes of examples "
                f"{sorted({ep.example.index for ep in episodes})} has blocked for "
                f"{SETTLE_TIMEOUT + BLOCKED_GRACE:g} s in a synchronous call (Env.run, setup or finalize); "
                "await slow work (asyncio.to_thread) instead of blocking the event loop"
            ) from None

    def close(self) -> None:
        if self.blocked:  # its thread still runs the loop; a daemon, it does not hold the process
            return
        for task in asyncio.all_tasks(self.loop):
            task.cancel()
        self.loop.run_until_complete(asyncio.sleep(0))
        self.loop.close()


async def _settle(episodes: list[Episode]) -> None:
    """Run the episodes' code until each has ended or waits for a reply (gathered roles get a few more
    passes to post their turns too); an episode that raised stops the run naming its environment."""
    deadline = time.monotonic() + SETTLE_TIMEOUT
    passes = 0
    while True:
        for ep in episodes:
            if (error := ep.failure()) is not None:
                raise ValueError(
                    f"environment {ep.env.name!r} example {ep.example.index}: its Env.run raised "
                    f"{type(error).__name__}: {error}; fix the environment's run"
                ) from error
        if all(ep.parked() for ep in episodes):
            for _ in range(3):
                await asyncio.sleep(0)
            if all(ep.parked() for ep in episodes):
                return
        if time.monotonic() > deadline:
            stuck = [ep.example.index for ep in episodes if not ep.parked()]
            raise TimeoutError(
                f"environment {episodes[0].env.name!r}: the episodes of examples {stuck} neither ended nor asked "
                f"for a turn within {SETTLE_TIMEOUT:g} s; their Env.run waits on something else"
            )
        passes += 1
        await asyncio.sleep(0 if passes < 100 else 0.001)


async def _score_all(episodes: list[Episode]) -> list:
    return await asyncio.gather(*(_score(ep) for ep in episodes))


async def _score(ep: Episode) -> tuple[Any, BaseException | None]:
    """(the trained role's scored Trace, the error of scoring or finalize, if any): every role's trace
    scored by its task, then the Env's finalize over the episode."""
    vf = _vf()
    from verifiers.v1.trace import TraceTask

    traces = [(role, role.trace) for role in ep.roles]
    trained = next((t for role, t in traces if role.agent.trainable), None)
    try:
        for role, trace in traces:
            await role.task.score(trace)
        task = ep.example.task
        episode = vf.Episode(
            task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
            traces=[t for _, t in traces],
            ok=True,
        )
        await ep.env.episode_env.finalize(task, episode)
    except Exception as e:
        return trained, e
    return trained, None


def _vf():
    import verifiers.v1 as vf

    return vf
