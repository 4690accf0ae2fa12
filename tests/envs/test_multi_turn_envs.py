"""calculator and guess-number: the built-in multi-turn environments' turns and rewards, through
Environment.score_conversations and the conversation's environment turn (no engine)."""

import pytest

from grpokit.environments.conversation import is_multi_turn
from grpokit.environments.environment import Environment, EnvSpec
from grpokit.envs.calculator import calculator
from tests.support import play


@pytest.mark.unit
def test_calculator_tool_is_arithmetic_only():
    assert calculator("347 * 29") == str(347 * 29) and calculator("-3 + 4") == "1"
    for bad in ("__import__('os')", "2 ** 999999", "a + 1", "1" * 300):
        with pytest.raises(ValueError):
            calculator(bad)


def test_calculator_rollout_calls_the_tool_and_is_scored():
    env = Environment(EnvSpec(id="calculator", args={"num_tasks": 4}))
    ex = env.examples[0]
    assert is_multi_turn(ex.task) and ex.messages[-1]["role"] == "user"
    a, op, b = ex.messages[-1]["content"].removeprefix("What is ").rstrip("?").split()
    call = f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{a} {op} {b}"}}}}</tool_call>'
    good = play(env, ex, [call, str(ex.task.data.answer)])
    assert good.messages[-2] == {"role": "tool", "content": str(ex.task.data.answer)} and good.tool_calls == 1
    broken = play(env, ex, ['<tool_call>{"name": "calc"}</tool_call>', "12"])
    assert broken.tool_errors == 1 and broken.messages[-2]["content"].startswith("Error: unknown tool")
    no_tool = play(env, ex, [str(ex.task.data.answer)])
    scores = env.score_conversations([ex] * 3, [good.messages, broken.messages, no_tool.messages])
    assert [round(r, 6) for r, _ in scores] == [1.2, 0.0, 1.0]
    assert [m["used_tool"] for _, m in scores] == [1.0, 1.0, 0.0]


def test_guess_number_gives_hints_and_rewards_fewer_guesses():
    env = Environment(EnvSpec(id="guess-number", args={"num_tasks": 20, "max_number": 10}))
    ex = next(e for e in env.examples if 3 <= e.task.data.secret <= 8)
    secret = ex.task.data.secret
    conv = play(env, ex, ["1", "no idea", "10", str(secret)])
    hints = [m["content"] for m in conv.messages if m["role"] == "user"][1:]
    assert hints == ["Higher.", "Reply with one number from 1 to 10.", "Lower."]
    assert conv.turn_rewards[1] == 0.0 and conv.turn_rewards[-1] == 1.0
    first_try = play(env, ex, [str(secret)])
    lost = play(env, ex, [str(secret - 1)] * 1)
    (r_slow, m_slow), (r_fast, _), (r_lost, m_lost) = env.score_conversations(
        [ex] * 3, [conv.messages, first_try.messages, lost.messages]
    )
    assert r_fast == 1.0 and r_slow == pytest.approx(1.0 - 0.15 * 3) and m_slow["solved"] == 1.0
    assert m_lost["solved"] == 0.0 and r_lost == pytest.approx(0.2 * (1 - 1 / 9))
