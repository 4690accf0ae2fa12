"""Multi-turn rollouts are token-faithful: the trainer's sequence is exactly what the engine saw and wrote,
turn after turn, its logprobs equal the engine's at step 0, and no environment token is trained on;
tool calls that fail become messages, never a crashed run."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from grpokit.common.logprobs import packed_token_logprobs
from grpokit.common.models import load_tokenizer
from grpokit.environments.chat_tokens import ChatTokens
from grpokit.environments.environment import Example
from grpokit.environments.tools import parse_tool_calls, run_tool_calls
from grpokit.inference import SamplingSettings
from grpokit.orchestrator.group_play import TurnLimits, generate_rollouts
from grpokit.orchestrator.packing import pack
from grpokit.trainer.metrics import mismatch_metrics
from tests.support import ChatLengthEnv, ToolReplyTask, serving


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("smollm2-135m")


@pytest.mark.unit
def test_environment_tokens_extend_the_conversation_as_the_template_renders_it(tokenizer):
    """In the canonical case (the reply's tokens are the template's), prompt + reply + environment ids
    equal the chat template of the whole conversation: the suffix rendering adds nothing else."""
    chat = ChatTokens(tokenizer)
    prompt = [{"role": "user", "content": "What is 12 * 34?"}]
    ids = chat.prompt(prompt)
    reply = tokenizer.encode('<tool_call>{"name": "calc"}</tool_call>', add_special_tokens=False)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    tool = [{"role": "tool", "content": "408"}]
    for completion in (reply + [end], reply):  # stopped on the end-of-turn token, or on a stop string
        env = chat.after_completion(completion, tool)
        whole = prompt + [{"role": "assistant", "content": tokenizer.decode(reply)}] + tool
        assert ids + completion + env == tokenizer.apply_chat_template(
            whole, tokenize=True, add_generation_prompt=True, return_dict=False
        )


@pytest.mark.unit
def test_tool_calls_parse_and_failures_become_messages():
    def add(a: int, b: int) -> int:
        return a + b

    def broken() -> str:
        raise RuntimeError("disk on fire")

    def slow() -> str:
        time.sleep(5)
        return "late"

    text = (
        '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
        "<tool_call>{not json}</tool_call>"
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "add", "arguments": {"c": 1}}</tool_call>'
        '<tool_call>{"name": "broken", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "slow", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 1}"}</tool_call>'
    )
    calls = parse_tool_calls(text)
    assert [c.name for c in calls] == ["add", "", "nope", "add", "broken", "slow", "add"]
    start = time.perf_counter()
    results = run_tool_calls({"add": add, "broken": broken, "slow": slow}, calls, timeout=0.3)
    assert time.perf_counter() - start < 2
    assert [r.status for r in results] == ["ok", "error", "error", "error", "error", "timeout", "ok"]
    assert results[0].content == "5" and results[-1].content == "2"
    assert "not valid JSON" in results[1].content and "unknown tool 'nope'" in results[2].content
    assert "TypeError" in results[3].content and "disk on fire" in results[4].content


def _three_turn_rollouts(engine, tokenizer):
    env, example = ChatLengthEnv(), Example(0, [{"role": "user", "content": "hello there"}], ToolReplyTask())
    # a random model rarely samples EOS: stop on a common letter so that turns end with a stop string
    sampling = SamplingSettings(temperature=1.0, max_tokens=12, stop=["e"], seed=3)
    groups = generate_rollouts(engine, tokenizer, [(env, example)], 2, sampling, 0, turns=TurnLimits(8, 400))
    return [r for g in groups for r in g]


def _check_token_faithful(model_path: str, rollouts, tokenizer) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32).eval()
    chat = ChatTokens(tokenizer)
    three_turns = [r for r in rollouts if r.metrics["turns"] == 3]
    assert three_turns, [r.metrics for r in rollouts]
    for r in rollouts:
        assert r.messages[-1]["role"] == "assistant" and r.step_ends is not None
        # the environment's tokens are exactly its messages' rendering after each reply
        env_runs = _runs(r.completion_mask, 0)
        assert len(env_runs) == r.metrics["turns"] - 1
        for (start, end), tool in zip(env_runs, [m for m in r.messages if m["role"] == "tool"]):
            reply = r.completion_ids[:start]
            assert r.completion_ids[start:end] == chat.after_completion(reply, [tool])
            assert all(lp == 0.0 for lp in r.completion_logprobs[start:end])
    (mb,) = pack(rollouts, [[1.0] * len(r.completion_ids) for r in rollouts], [True] * len(rollouts), 2048)
    env_positions = torch.cat(
        [torch.tensor([0] * len(r.prompt_ids) + [1 - m for m in r.completion_mask]) for r in rollouts]
    ).bool()
    assert env_positions.any() and not (mb.loss_mask_T[env_positions] > 0).any()
    with torch.no_grad():
        trainer = packed_token_logprobs(model, mb.input_ids_T, mb.position_ids_T, mb.seq_lens_N, 1.0)
    error = mismatch_metrics(trainer, mb.inference_logprobs_T, mb.loss_mask_T)["token_mult_prob_error"]
    assert abs(float(error) - 1) < 1e-4
    # the trainer's shared-prefix path (a trie over the conversations: they share the prompt, and
    # rollouts of one group may share whole turns) reads the same logprobs on the trained tokens
    with torch.no_grad():
        shared = packed_token_logprobs(
            model, mb.input_ids_T, mb.position_ids_T, mb.seq_lens_N, 1.0, share_prefixes=True
        )
    trained = mb.loss_mask_T > 0
    assert torch.allclose(shared[trained], trainer[trained], atol=1e-5)


def _runs(mask: list[int], value: int) -> list[tuple[int, int]]:
    """(start, end) of each maximal run of `value` in mask."""
    runs, start = [], None
    for i, m in enumerate([*mask, None]):
        if m == value and start is None:
            start = i
        elif m != value and start is not None:
            runs.append((start, i))
            start = None
    return runs


def test_three_turn_rollout_is_token_faithful_builtin_engine(tiny_model, tokenizer):
    from grpokit.inference.builtin import BuiltinEngine

    engine = BuiltinEngine(device="cpu")
    engine.setup(tiny_model)
    engine.weight_step = 0
    _check_token_faithful(tiny_model, _three_turn_rollouts(engine, tokenizer), tokenizer)


def test_three_turn_rollout_is_token_faithful_through_the_server(tiny_model, tokenizer):
    from grpokit.inference.remote import RemoteEngine

    with serving(tiny_model) as (_, server):
        engine = RemoteEngine(base_url=server.url, model_name="tiny", max_retries=0, timeout=60)
        engine.setup(tiny_model)
        _check_token_faithful(tiny_model, _three_turn_rollouts(engine, tokenizer), tokenizer)


def test_budget_ends_a_conversation_at_a_turn_boundary(tiny_model, tokenizer):
    from grpokit.inference.builtin import BuiltinEngine

    engine = BuiltinEngine(device="cpu")
    engine.setup(tiny_model)
    env, example = ChatLengthEnv(), Example(0, [{"role": "user", "content": "hi"}], ToolReplyTask())
    sampling = SamplingSettings(temperature=1.0, max_tokens=12, stop=["e"], seed=3)
    prompt_len = len(ChatTokens(tokenizer).prompt(example.messages))
    budget = prompt_len + 12 + 10  # room for one turn, not for a tool message and a second turn
    (group,) = generate_rollouts(engine, tokenizer, [(env, example)], 2, sampling, 0, turns=TurnLimits(8, budget))
    for r in group:
        assert r.num_tokens <= budget and r.metrics["turns"] == 1
        assert r.is_truncated and all(r.completion_mask)  # whole turns only, no dangling environment tokens


def test_single_turn_tasks_are_unchanged(tiny_model, tokenizer):
    """A task without tools or respond takes the single-turn path: no messages, no turn metrics."""
    from grpokit.environments.environment import Environment, EnvSpec

    env = Environment(EnvSpec(id="reverse-text"))
    from grpokit.inference.builtin import BuiltinEngine

    engine = BuiltinEngine(device="cpu")
    engine.setup(tiny_model)
    sampling = SamplingSettings(temperature=1.0, max_tokens=8, seed=1)
    (group,) = generate_rollouts(engine, tokenizer, [(env, env.examples[0])], 2, sampling, 0)
    assert all(r.messages is None and "turns" not in r.metrics for r in group)


def test_respond_must_return_messages(tokenizer):
    from grpokit.environments.conversation import Conversation, as_env_turn

    conv = Conversation(SimpleNamespace(name="e"), SimpleNamespace(index=3), [], [])
    with pytest.raises(TypeError, match="respond\\(\\) returned str"):
        as_env_turn("hello", conv)
    with pytest.raises(TypeError, match="str 'role' and 'content'"):
        as_env_turn([{"role": "user"}], conv)
    assert as_env_turn(None, conv).done


def test_mixed_single_and_multi_turn_prompts_keep_their_paths_and_order(tiny_model, tokenizer):
    """A step drawing from a single-turn and a multi-turn environment: each prompt takes its own path
    (single-turn step rewards kept), groups in prompt order with consecutive group ids."""
    from grpokit.environments.environment import Environment, EnvSpec
    from grpokit.inference.builtin import BuiltinEngine

    engine = BuiltinEngine(device="cpu")
    engine.setup(tiny_model)
    single = Environment(EnvSpec(id="reverse-text"))
    multi = (ChatLengthEnv(), Example(0, [{"role": "user", "content": "hi"}], ToolReplyTask()))
    sampling = SamplingSettings(temperature=1.0, max_tokens=12, stop=["e"], seed=3)
    prompts = [(single, single.examples[0]), multi, (single, single.examples[1])]
    groups = generate_rollouts(engine, tokenizer, prompts, 2, sampling, 10, turns=TurnLimits(8, 400))
    assert [g[0].group_id for g in groups] == [10, 11, 12]
    assert [g[0].env_id for g in groups] == ["reverse-text", "three-turn", "reverse-text"]
    assert groups[0][0].messages is None and groups[0][0].step_rewards is not None
    assert groups[1][0].messages is not None


def test_a_reply_cut_at_max_tokens_earns_a_zero_turn_reward_in_a_game(tiny_model, tokenizer):
    """Per-turn rewards stay defined (for the process advantage) when a game's first reply is cut."""
    from grpokit.inference.builtin import BuiltinEngine

    engine = BuiltinEngine(device="cpu")
    engine.setup(tiny_model)
    example = Example(0, [{"role": "user", "content": "hi"}], ToolReplyTask())
    sampling = SamplingSettings(temperature=1.0, max_tokens=2, seed=3)  # no stop: every reply is cut
    (group,) = generate_rollouts(
        engine, tokenizer, [(ChatLengthEnv(), example)], 2, sampling, 0, turns=TurnLimits(8, 400)
    )
    for r in group:
        assert r.is_truncated and r.step_rewards == [0.0] and r.step_ends == [len(r.completion_ids) - 1]


@pytest.mark.unit
def test_respond_that_raises_names_the_environment_and_the_last_turn_runs_no_tools():
    from grpokit.environments.conversation import Conversation, environment_turn

    class Broken:
        def respond(self, messages, state):
            raise RuntimeError("game server down")

    calls = []

    class WithTool:
        tools = (lambda: calls.append(1) or "ran",)

    conv = Conversation(SimpleNamespace(name="game"), SimpleNamespace(index=4, task=Broken()), [], [])
    conv.messages.append({"role": "assistant", "content": "5"})
    with pytest.raises(ValueError, match="environment 'game' example 4: respond\\(\\) raised RuntimeError"):
        environment_turn(conv)
    conv.example.task = WithTool()
    conv.messages.append({"role": "assistant", "content": '<tool_call>{"name": "<lambda>"}</tool_call>'})
    assert environment_turn(conv, last_turn=True).done and not calls and conv.tool_calls == 0
    assert environment_turn(conv).messages == [{"role": "tool", "content": "ran"}] and calls == [1]
