"""Stand-ins for multi-turn and streaming tests: a scripted task, environment and engine, a rollout
played without an engine, the end-to-end multi-turn flags, and draining a generation stream."""

from __future__ import annotations

from abc import abstractmethod

from grpokit.inference import InferenceEngine


class ToolReplyTask:
    """A multi-turn task for tests: answers each reply with a numbered tool message (turn reward 0.5)
    until `max_turns` replies, whatever the model wrote (a random model writes no tool calls)."""

    max_turns = 3

    def respond(self, messages, state):
        from grpokit.environments import EnvTurn

        state["n"] = state.get("n", 0) + 1
        return EnvTurn(messages=[{"role": "tool", "content": f"result {state['n']}"}], reward=0.5)


class ChatLengthEnv:
    """An environment stand-in for tests of multi-turn rollouts: a conversation's reward is its number
    of messages."""

    name = "three-turn"

    def score_conversations(self, examples, chats, states=None, finish_reasons=None):
        return [(float(len(chat)), {}) for chat in chats]


def play(env, example, replies: list[str]):
    """A multi-turn rollout without an engine: the model's `replies`, each answered by the environment's
    turn (grpokit.environments.conversation.environment_turn), until the environment ends the rollout."""
    from grpokit.environments.conversation import Conversation, environment_turn

    conv = Conversation(env, example, [], [dict(m) for m in example.messages])
    for reply in replies:
        conv.messages.append({"role": "assistant", "content": reply})
        turn = environment_turn(conv)
        conv.turn_rewards.append(turn.reward)
        if turn.done:
            conv.done = True
            break
        conv.messages += turn.messages
    return conv


# multi-turn environments for end-to-end runs on the tiny random model: it rarely samples EOS, so replies
# stop on a common letter; the game answers each one ("Reply with one number ...") for up to 3 turns, and
# verifiers' user-sim Env has the engine play a simulated user (untrained) for up to 2 turns
MULTI_TURN_GAME_FLAGS = (
    "--data.env",
    "[{id: guess-number, args: {num_tasks: 50}, ratio: 0.5},"
    " {id: user-sim+reverse-text, env_args: {user: {max_turns: 2}}, ratio: 0.5}]",
    "--data.sampling.stop",
    "[e]",
    "--data.max_turns",
    "3",
)


def drain(stream) -> dict:
    """Advance a GenerationStream until nothing is in flight; each finished group's completions by its key."""
    out = {}
    while stream.inflight:
        for group in stream.advance():
            out[group.request.key] = group.completions
    return out


class ReplyEngine(InferenceEngine):
    """An InferenceEngine for tests that writes scripted replies: `reply(prompt_ids, i)` for the i-th of
    each prompt's n completions (subclasses define it); no model, no weights."""

    def __init__(self, tokenizer) -> None:
        self.tok, self.end = tokenizer, tokenizer.convert_tokens_to_ids("<|im_end|>")

    def setup(self, model) -> None:
        pass

    def load_weights(self, update) -> None:
        pass

    def generate(self, prompts, n, sampling):
        return [[self.reply(ids, i) for i in range(n)] for ids in prompts]

    @abstractmethod
    def reply(self, prompt_ids: list[int], i: int):
        """The Completion of the i-th reply to `prompt_ids` (abstract: not a component of the registry)."""
