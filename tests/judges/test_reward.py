"""The failure policy (score as a value, drop the group, stop, retry) over real endpoints, counted; and the
run's cache of replies, which a resumed run reads instead of asking again (grpokit.judges.reward, cache)."""

import json

import pytest

from grpokit.common.errors import RunDataError
from grpokit.judges.cache import CACHE_FILE, JudgeCache
from grpokit.judges.reward import JudgeReward, JudgeSettings
from tests.judges.helpers import answer, dead_url
from tests.support.servers import ScriptedServer

CONVERSATIONS = [
    [{"role": "user", "content": "Reverse: abc"}, {"role": "assistant", "content": "cba"}],
    [{"role": "user", "content": "Reverse: xy"}, {"role": "assistant", "content": "xy"}],
]
LABELS = ["example 0", "example 1"]


def http_settings(url: str, **kw) -> JudgeSettings:
    return JudgeSettings(
        **{"kind": "http", "model": "judge", "base_url": url, "rubric": "Reversed exactly.", "timeout": 5, **kw}
    )


def test_scores_come_back_scaled_and_counted():
    with ScriptedServer([answer("Looks right.\nScore: 8")]) as server:
        reward = JudgeReward(http_settings(server.url))
        judged = reward.judge(CONVERSATIONS, LABELS)
    assert [j.score for j in judged] == [0.8, 0.8] and reward.counts["requests"] == 2
    assert reward.settle(judged, LABELS, "env") == ([0.8, 0.8], False)


@pytest.mark.parametrize(("policy", "expected"), [("score", ([0.25, 0.25], False)), ("drop_group", ([0.0, 0.0], True))])
def test_a_dead_endpoint_follows_the_policy(policy, expected):
    reward = JudgeReward(http_settings(dead_url(), retries=1, on_failure=policy, failure_score=0.25))
    judged = reward.judge(CONVERSATIONS, LABELS)
    assert [j.failure for j in judged] == ["down", "down"] and reward.counts["down"] == 2
    assert reward.settle(judged, LABELS, "env") == expected
    assert reward.counts["dropped_groups" if policy == "drop_group" else "scored_as_value"] == (
        1 if policy == "drop_group" else 2
    )
    assert reward.cache.replies == {}  # nothing came back, nothing kept: a resumed run asks again


def test_stop_names_the_environment_example_and_failure():
    reward = JudgeReward(http_settings(dead_url(), retries=0, on_failure="stop"))
    judged = reward.judge(CONVERSATIONS, LABELS)
    with pytest.raises(RunDataError, match=r"environment 'rev' example 0: judge 'judge' failed \(down"):
        reward.settle(judged, LABELS, "rev")


def test_garbage_from_a_tiny_model_is_a_counted_parse_failure(tiny_model):
    settings = JudgeSettings(
        kind="builtin", model=tiny_model, rubric="Reversed exactly.", max_tokens=6, device="cpu", on_failure="score"
    )
    reward = JudgeReward(settings)
    judged = reward.judge(CONVERSATIONS, LABELS)
    assert [j.failure for j in judged] == ["parse", "parse"] and reward.counts["parse"] == 2
    assert "no `Score: N` line" in judged[0].reply
    assert reward.settle(judged, LABELS, "env") == ([0.0, 0.0], False)


def test_retry_asks_again_past_the_cache_then_stops():
    with ScriptedServer([answer("I am unsure."), answer("I am unsure."), answer("Score: 6")]) as server:
        reward = JudgeReward(http_settings(server.url, retries=2, on_failure="retry", max_concurrency=1))
        judged = reward.judge(CONVERSATIONS, LABELS)
    assert [j.score for j in judged] == [0.6, 0.6] and reward.counts["retried"] == 2  # one round: both asked again
    assert all(reply == "Score: 6" for reply in reward.cache.replies.values())  # the answer that counted is kept
    with ScriptedServer([answer("no idea")]) as server:
        reward = JudgeReward(http_settings(server.url, retries=1, on_failure="retry"))
        judged = reward.judge(CONVERSATIONS, LABELS)
        with pytest.raises(RunDataError, match="'retry'"):
            reward.settle(judged, LABELS, "env")


def test_a_resumed_run_reads_the_replies_of_the_first(tmp_path):
    with ScriptedServer([answer("Score: 3"), answer("Score: 9")]) as server:
        url = server.url
        first = JudgeReward(http_settings(url, max_concurrency=1), JudgeCache())
        first.cache.attach(tmp_path)
        scores = [j.score for j in first.judge(CONVERSATIONS, LABELS)]
    stored = json.loads((tmp_path / CACHE_FILE).read_text())
    assert stored["version"] == 1 and sorted(stored["replies"].values()) == ["Score: 3", "Score: 9"]
    resumed = JudgeReward(http_settings(url), JudgeCache())  # the server is gone: only the cache can answer
    resumed.cache.attach(tmp_path)
    assert [j.score for j in resumed.judge(CONVERSATIONS, LABELS)] == scores
    assert resumed.counts["requests"] == 0 and resumed.counts["cached"] == 2
    other = JudgeReward(http_settings(url, rubric="Another rubric."), resumed.cache)  # another key: asked
    assert [j.failure for j in other.judge(CONVERSATIONS[:1], LABELS[:1])] == ["down"]


def test_bad_settings_are_refused_naming_the_key():
    with pytest.raises(ValueError, match="data.env 'x'.*unknown judge settings \\['wieght'\\]"):
        JudgeSettings.from_recipe({"kind": "http", "model": "m", "wieght": 1}, "data.env 'x'")
    with pytest.raises(ValueError, match="on_failure"):
        JudgeSettings.from_recipe({"kind": "builtin", "model": "m", "rubric": "r", "on_failure": "zero"}, "w")
    with pytest.raises(ValueError, match="base_url"):
        JudgeSettings.from_recipe({"kind": "http", "model": "m", "rubric": "r"}, "w")
    with pytest.raises(ValueError, match="rubric"):
        JudgeSettings.from_recipe({"kind": "builtin", "model": "m"}, "w")
