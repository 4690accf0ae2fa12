"""A reward function that raises or returns NaN, inf, None, a str, a bool or a value past 1e6 stops the run
with an error naming the environment and example; what the run wrote before stays whole."""

import json
import re

import pytest
import torch

from grpokit.environments.environment import Environment, EnvSpec
from grpokit.main import entry, main
from grpokit.testing import tiny_fit_argv
from grpokit.transport.codec import decode_batch
from tests.support import installed_module, read_metrics

BAD_REWARD_ENV = '''
"""A taskset whose reward is what the reply asks for ("raise", "nan", "inf", "none", "str", "bool", "huge";
0.5 otherwise), or REWARD for every reply when set, and which raises from the FAIL_AFTER-th scoring call on."""
import verifiers.v1 as vf

FAIL_AFTER = None
REWARD = None
calls = 0


class BadData(vf.TaskData):
    answer: str = ""


class BadTask(vf.Task[BadData]):
    @vf.reward(weight=1.0)
    async def misbehave(self, trace: vf.Trace) -> float:
        global calls
        calls += 1
        reply = trace.last_reply or ""
        if reply == "raise" or (FAIL_AFTER is not None and calls > FAIL_AFTER):
            raise RuntimeError("reward exploded")
        if REWARD is not None:
            return REWARD
        bad = {"nan": float("nan"), "inf": float("inf"), "none": None, "str": "0.5", "bool": True, "huge": 1e308}
        return bad.get(reply, 0.5)

    def step_rewards(self, reply: str) -> list[tuple[int, float]]:
        return {
            "steps-nan": [(2, float("nan"))],
            "steps-unordered": [(5, 0.1), (2, 0.2)],
            "steps-past-end": [(99, 1.0)],
            "steps-huge": [(2, 1e308)],
            "steps-str": [(2, "0.5")],
        }.get(reply, [])


class BadConfig(vf.TasksetConfig):
    num_tasks: int = 4


class BadTaskset(vf.Taskset[BadTask, BadConfig]):
    def load(self):
        for i in range(self.config.num_tasks):
            yield BadTask(BadData(prompt="Say something.", answer="x", id=f"bad-{i}"), self.config.task)


__all__ = ["BadTaskset"]
'''


@pytest.fixture
def bad_env(tmp_path, monkeypatch):
    with installed_module(tmp_path, monkeypatch, "bad_reward_env", BAD_REWARD_ENV):
        yield


@pytest.mark.parametrize(
    "reply,message",
    [
        (
            "raise",
            r"example 1: scoring the reply 'raise' failed \(.*RuntimeError: reward "
            r"exploded\); fix the reward function of data.env id 'bad-reward-env'",
        ),
        ("none", r"example 1: scoring the reply 'none' failed \(.*NoneType"),
        ("nan", r"example 1: reward is nan, expected a finite number"),
        ("inf", r"example 1: reward is inf, expected a finite number"),
        ("str", r"example 1: reward 'misbehave' is '0.5' \(str\), expected a number; return a float from the reward"),
        ("bool", r"example 1: reward 'misbehave' is True \(bool\), expected a number"),
        ("huge", r"example 1: reward is 1e\+308, expected a finite number with \|reward\| <= 1e\+06; fix or rescale"),
    ],
    ids=["raises", "None", "NaN", "inf", "str", "bool", "huge"],
)
def test_a_bad_reward_names_the_environment_and_example(bad_env, reply, message):
    env = Environment(EnvSpec(id="bad-reward-env"))
    assert env.score(env.examples[1:2], ["fine"]) == [(0.5, {})]
    with pytest.raises(ValueError, match=r"environment 'bad-reward-env' " + message):
        env.score(env.examples[:2], ["fine", reply])


def test_a_reward_that_breaks_mid_run_stops_it_and_leaves_earlier_files_whole(tmp_path, tiny_model, bad_env):
    import bad_reward_env

    bad_reward_env.FAIL_AFTER = 16  # 8 rollouts per step: steps 0 and 1 score, step 2 raises
    argv = tiny_fit_argv(
        tmp_path,
        tiny_model,
        "breaks",
        "--data.env",
        json.dumps([{"id": "bad-reward-env", "args": {}}]),
        "--data.eval",
        "null",
        "--data.max_async_level",
        "0",
        "--data.sampling.max_tokens",
        "4",
        "--trainer.max_steps",
        "4",
        "--ckpt.interval",
        "1",
        "--data.transport",
        '{"class_path": "FilesystemTransport", "init_args": {"keep_last": 0}}',
    )
    with pytest.raises(
        RuntimeError,
        match=r"the orchestrator failed: .*environment 'bad-reward-env' example "
        r"\d+: scoring the reply .* failed \(.*RuntimeError: reward exploded\)",
    ):
        main(argv)
    run = tmp_path / "breaks"
    assert [int(r["step"]) for r in read_metrics(run)] == [0, 1]
    assert [decode_batch((run / "rollouts" / f"step_{s}.safetensors").read_bytes()).step for s in (0, 1)] == [0, 1]
    assert not (run / "rollouts" / "step_2.safetensors").exists()
    for step in (1, 2):  # the checkpoints written before the failure load
        assert (
            torch.load(run / "checkpoints" / f"step_{step}.ckpt", map_location="cpu", weights_only=False)["global_step"]
            == step
        )


@pytest.mark.parametrize(
    "reward,message",
    [
        (1e308, r"reward is 1e\+308, expected a finite number with \|reward\| <= 1e\+06; fix or rescale"),
        ("0.5", r"reward 'misbehave' is '0.5' \(str\), expected a number"),
        (True, r"reward 'misbehave' is True \(bool\), expected a number"),
    ],
    ids=["1e308", "str", "bool"],
)
def test_a_bad_reward_stops_fit_before_any_step_trains(tmp_path, tiny_model, bad_env, capsys, caplog, reward, message):
    """Through the `grpokit` command: one line naming the environment and example (exit 1), no traceback
    (the rollout thread used to log its own, 80 lines, before that line)."""
    # 1e308 used to give NaN advantages (the group std overflows), skipped steps and an error blaming model.lr.
    import bad_reward_env

    bad_reward_env.REWARD = reward
    argv = tiny_fit_argv(
        tmp_path,
        tiny_model,
        "bad",
        "--data.env",
        json.dumps([{"id": "bad-reward-env", "args": {}}]),
        "--data.eval",
        "null",
        "--data.sampling.max_tokens",
        "4",
        "--trainer.max_steps",
        "2",
    )
    assert entry(argv) == 1
    err = capsys.readouterr().err
    assert re.search(r"grpokit: error: environment 'bad-reward-env' example \d+: " + message, err), err[-3000:]
    assert "Traceback" not in err
    assert "orchestrator failed" not in caplog.text and "Traceback" not in caplog.text
    assert not (tmp_path / "bad" / "metrics.csv").exists() or not read_metrics(tmp_path / "bad")  # no step trained


@pytest.mark.parametrize("reply", ["steps-nan", "steps-unordered", "steps-past-end", "steps-huge", "steps-str"])
def test_bad_step_rewards_name_the_environment_and_example(bad_env, reply):
    env = Environment(EnvSpec(id="bad-reward-env"))
    with pytest.raises(
        ValueError,
        match=rf"environment 'bad-reward-env' example 0: step_rewards returned .*ascending ends in 1..{len(reply)}",
    ):
        env.step_rewards(env.examples[:1], [reply])


@pytest.mark.unit
@pytest.mark.parametrize("reward", [float("nan"), float("inf"), -float("inf"), 1e300, "0.5", True, [1.0]], ids=repr)
def test_a_bad_turn_reward_names_the_environment_and_example(reward):
    """EnvTurn.reward (the `process` advantage's per-turn reward) is held to the rubric rewards' rule: a NaN
    would zero its whole group's advantages, inf make them NaN, a str or bool become a number."""
    from types import SimpleNamespace

    from grpokit.environments import EnvTurn
    from grpokit.environments.conversation import Conversation, environment_turn

    class Game:
        def __init__(self, reward):
            self.reward = reward

        def respond(self, messages, state):
            return EnvTurn(messages=[{"role": "user", "content": "again"}], reward=self.reward)

    conv = Conversation(SimpleNamespace(name="game"), SimpleNamespace(index=4, task=Game(0.25)), [], [])
    conv.messages = [{"role": "assistant", "content": "move"}]
    assert environment_turn(conv).reward == 0.25
    conv.example.task = Game(reward)
    with pytest.raises(ValueError, match=r"environment 'game' example 4: respond\(\) returned a turn reward of"):
        environment_turn(conv)


@pytest.mark.unit
@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf"), "5", True])
def test_a_bad_tool_timeout_names_the_environment_and_example(timeout):
    """A task's tool_timeout of 0, -1 or NaN made every call "take longer than nan s"; inf raised an
    OverflowError blamed on the tool."""
    from types import SimpleNamespace

    from grpokit.environments.conversation import Conversation, environment_turn

    def ping() -> str:
        return "pong"

    conv = Conversation(SimpleNamespace(name="tools"), SimpleNamespace(index=2, task=None), [], [])
    conv.messages = [{"role": "assistant", "content": '<tool_call>{"name": "ping", "arguments": {}}</tool_call>'}]
    conv.example.task = SimpleNamespace(tools=[ping], tool_timeout=2.5)
    assert environment_turn(conv).messages == [{"role": "tool", "content": "pong"}]
    conv.example.task = SimpleNamespace(tools=[ping], tool_timeout=timeout)
    with pytest.raises(ValueError, match=r"environment 'tools' example 2: the task's tool_timeout is .*finite number"):
        environment_turn(conv)
