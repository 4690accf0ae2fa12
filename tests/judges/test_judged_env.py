"""A recipe adds a judge reward to an environment's rewards with a weight (`data.env[i].judge`): the judge
sees each rollout's whole conversation, its weighted score joins the rubric's, its metrics are logged per
rollout, and a dropped group trains nothing (grpokit.judges.judged_env)."""

import pytest
import yaml

from grpokit.environments.environment import Environment, EnvSpec
from grpokit.judges import JudgeFormat, attach_run, judged
from grpokit.judges.cache import CACHE_FILE, JudgeCache
from tests.judges.helpers import answer, dead_url
from tests.support.servers import ScriptedServer

RUBRIC = "The reply is the prompt's text reversed, nothing else."


def judge_env(url: str, **judge) -> Environment:
    spec = EnvSpec(id="reverse-text", judge={"kind": "http", "model": "j", "base_url": url, "rubric": RUBRIC, **judge})
    return judged(Environment(spec), JudgeCache())


def test_the_weighted_judge_score_is_added_to_the_rubric_reward(tmp_path):
    with ScriptedServer([answer("Score: 5")]) as server:
        env = judge_env(server.url, weight=0.5, name="rev_judge")
        attach_run([env], tmp_path)
        example = env.examples[0]
        replies = [example.messages[-1]["content"][::-1], "something else"]
        scored = env.score([example] * 2, replies)
        prompt = server.request_bodies[0]["messages"][0]["content"]
    plain = Environment(EnvSpec(id="reverse-text")).score([example] * 2, replies)
    assert [r for r, _ in scored] == pytest.approx([r + 0.5 * 0.5 for r, _ in plain])
    chats = [example.messages + [{"role": "assistant", "content": reply}] for reply in replies]
    assert prompt in [JudgeFormat().render(chat, RUBRIC) for chat in chats]  # the whole conversation, exactly
    metrics = scored[0][1]
    assert metrics["reward/rev_judge"] == 0.5 and metrics["judge/rev_judge/parse_failures"] == 0.0
    assert metrics["judge/rev_judge/dropped"] == 0.0 and metrics["judge/rev_judge/seconds"] >= 0
    assert (tmp_path / CACHE_FILE).exists()


def test_a_dropped_group_gets_equal_zero_rewards_and_is_counted():
    env = judge_env(dead_url(), retries=0, on_failure="drop_group")
    example = env.examples[0]
    scored = env.score([example] * 3, ["a", "b", example.messages[-1]["content"][::-1]])
    assert [r for r, _ in scored] == [0.0, 0.0, 0.0]
    assert all(m["judge/judge/down"] == 1.0 and m["judge/judge/dropped"] == 1.0 for _, m in scored)
    assert env.judges[0].counts["dropped_groups"] == 1


def test_an_environment_without_a_judge_is_left_as_it_is():
    env = Environment(EnvSpec(id="reverse-text"))
    assert judged(env) is env


def test_a_recipe_gives_an_environment_a_judge():
    from importlib.resources import files

    from grpokit.cli import parse_recipe

    recipe = str(files("grpokit.recipes") / "reverse_text.yaml")
    judge = {"kind": "http", "model": "j", "base_url": "http://127.0.0.1:8000/v1", "rubric": RUBRIC, "weight": 0.5}
    text = parse_recipe(["--config", recipe, "--data.env", yaml.safe_dump([{"id": "reverse-text", "judge": judge}])])
    assert yaml.safe_load(text)["data"]["env"][0]["judge"] == judge


def test_two_judges_each_add_their_weighted_score_and_metrics():
    """`judge` as a list: each judge is asked, its weighted score added, its metrics under its own name;
    two judges with one name are refused at start."""
    with ScriptedServer([answer("Score: 5")]) as five, ScriptedServer([answer("Verdict: yes")]) as yes:
        first = {"kind": "http", "model": "j", "base_url": five.url, "rubric": RUBRIC, "weight": 0.5, "name": "a"}
        second = {**first, "base_url": yes.url, "parser": "verdict", "weight": 2.0, "name": "b"}
        env = judged(Environment(EnvSpec(id="reverse-text", judge=[first, second])), JudgeCache())
        example = env.examples[0]
        scored = env.score([example] * 2, ["x", "y"])
    plain = Environment(EnvSpec(id="reverse-text")).score([example] * 2, ["x", "y"])
    assert [r for r, _ in scored] == pytest.approx([r + 0.5 * 0.5 + 2.0 * 1.0 for r, _ in plain])
    assert scored[0][1]["reward/a"] == 0.5 and scored[0][1]["reward/b"] == 1.0
    with pytest.raises(ValueError, match="share a name"):
        judged(Environment(EnvSpec(id="reverse-text", judge=[first, {**second, "name": "a"}])))


RUBRIC_ENV = '''
"""A taskset whose reward function asks a judge itself (grpokit.judges.JudgeReward.ascore)."""
import os

import verifiers.v1 as vf

from grpokit.judges import JudgeReward, JudgeSettings

JUDGE = None


class JudgedTask(vf.Task[vf.TaskData]):
    @vf.reward(weight=2.0)
    async def judged(self, trace: vf.Trace) -> float:
        global JUDGE
        if JUDGE is None:  # the endpoint of the test's scripted server
            JUDGE = JudgeReward(JudgeSettings(kind="http", model="j", base_url=os.environ["JUDGE_URL"], rubric="r"))
        return await JUDGE.ascore([m.model_dump(exclude_none=True) for m in trace.messages])


class JudgedTaskset(vf.Taskset[JudgedTask, vf.TasksetConfig]):
    def load(self):
        for i in range(3):
            yield JudgedTask(vf.TaskData(prompt=f"Say {i}.", id=f"t{i}"), self.config.task)


__all__ = ["JudgedTaskset"]
'''


def test_a_rubric_of_ones_own_asks_a_judge(tmp_path, monkeypatch):
    """An environment author's reward function calls a judge (JudgeReward.ascore): the reward is the judge's
    score times the function's weight, and the judge saw the rollout's conversation."""
    from tests.support import installed_module

    with ScriptedServer([answer("Score: 10"), answer("Score: 5")]) as server:
        monkeypatch.setenv("JUDGE_URL", server.url)
        with installed_module(tmp_path, monkeypatch, "judged_rubric_env", RUBRIC_ENV) as module:
            env = Environment(EnvSpec(id="judged-rubric-env"))
            scored = env.score(env.examples[:2], ["ten", "five"])
            asked = [b["messages"][0]["content"] for b in server.request_bodies]
            assert module.JUDGE.counts["requests"] == 2
    assert sorted(r for r, _ in scored) == [1.0, 2.0]  # weight 2 x the judge's 0.5 and 1.0
    assert any("ten" in a for a in asked) and any("five" in a for a in asked)
