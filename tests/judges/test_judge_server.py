"""A judge on a server of its own (grpokit.judges.server, what `grpokit judge` serves): a classifier's
scores over HTTP equal the in-process classifier's, a generative judge's replies equal the in-process
judge's, bad requests are refused naming the field, and the recipe names the one judge to serve."""

import json
import urllib.error
import urllib.request

import pytest

from grpokit.judges import JudgeReward, JudgeSettings
from grpokit.judges.backends import BuiltinJudge, HTTPJudge
from grpokit.judges.classifier import ClassifierReward
from grpokit.judges.remote_classifier import RemoteClassifier
from grpokit.judges.server import address_of, judge_server, served_judge
from tests.judges.helpers import dead_url

CONVERSATIONS = [
    [{"role": "user", "content": "Say something about rain."}, {"role": "assistant", "content": "Rain is wet!"}],
    [{"role": "user", "content": "Say something about tea."}, {"role": "assistant", "content": "Tea is warm."}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": ""}],
]


@pytest.fixture(scope="module")
def classifier_server(tiny_classifier):
    settings = JudgeSettings(kind="classifier", model=tiny_classifier, base_url="http://127.0.0.1:0/v1")
    with judge_server(settings, "127.0.0.1", 0).start() as server:
        yield server


def post(url: str, body) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_a_served_classifier_scores_as_the_in_process_one(classifier_server, tiny_classifier):
    local = ClassifierReward(tiny_classifier)
    remote = RemoteClassifier(classifier_server.url, tiny_classifier, retries=0, max_batch_size=2)  # two requests
    replies = remote.judge_conversations(CONVERSATIONS)
    assert [r.failure for r in replies] == [None] * 3
    assert [float(r.text) for r in replies] == pytest.approx(local.score(CONVERSATIONS), abs=1e-5)
    assert remote.identity == local.identity  # the same model's scores: one cache key for both


def test_a_judge_reward_through_the_server_settles_like_any(classifier_server, tiny_classifier):
    settings = JudgeSettings(kind="classifier", model=tiny_classifier, base_url=classifier_server.url, name="rm")
    reward = JudgeReward(settings)
    judged = reward.judge(CONVERSATIONS, ["example 0", "example 1", "example 2"])
    assert all(j.failure is None for j in judged)
    assert [j.score for j in judged] == pytest.approx(ClassifierReward(tiny_classifier).score(CONVERSATIONS), abs=1e-5)
    assert reward.counts["requests"] == 3


def test_the_reward_server_refuses_bad_requests_naming_the_field(classifier_server, tiny_classifier):
    url = classifier_server.url + "/rewards"
    status, body = post(url, {"model": "other", "conversations": CONVERSATIONS})
    assert status == 404 and body["error"]["param"] == "model"
    for bad in ([], "text", [[]], [[{"content": "no role"}]], [["not a message"]]):
        status, body = post(url, {"model": tiny_classifier, "conversations": bad})
        assert status == 400 and body["error"]["param"] == "conversations", bad
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(url, timeout=10)  # a GET
    assert e.value.code == 405
    with urllib.request.urlopen(classifier_server.url + "/models", timeout=10) as r:
        assert json.loads(r.read())["data"][0]["id"] == tiny_classifier


def test_a_dead_reward_server_is_a_counted_failure(tiny_classifier):
    replies = RemoteClassifier(dead_url(), tiny_classifier, retries=1).judge_conversations(CONVERSATIONS[:2])
    assert [r.failure for r in replies] == ["down", "down"] and "after 2 tries" in replies[0].detail


def test_a_served_generative_judge_replies_as_the_in_process_one(tiny_model):
    settings = JudgeSettings(kind="http", model=tiny_model, rubric="r", base_url="http://127.0.0.1:0/v1", device="cpu")
    prompts = ["Grade: 'olleh'. Score: N from 0 to 10.", "Is 2 + 2 = 4? Verdict: yes or no."]
    with judge_server(settings, "127.0.0.1", 0).start() as server:
        replies = HTTPJudge(server.url, tiny_model, max_tokens=8, retries=0).ask(prompts)
    local = BuiltinJudge(tiny_model, max_tokens=8, device="cpu").ask(prompts)
    assert [r.failure for r in replies] == [None, None]
    assert [r.text for r in replies] == [r.text for r in local]  # same model, both greedy


def recipe_with(*judges: dict) -> dict:
    return {"data": {"env": [{"id": f"env{i}", "judge": j} for i, j in enumerate(judges)]}}


def test_the_recipe_names_the_judge_to_serve():
    served = {"kind": "classifier", "model": "m", "name": "rm", "base_url": "http://127.0.0.1:8100/v1"}
    local = {"kind": "classifier", "model": "m2", "name": "local"}
    settings, address = served_judge(recipe_with(local, served))
    assert settings.name == "rm" and address == ("127.0.0.1", 8100)
    with pytest.raises(ValueError, match="no judge with a base_url"):
        served_judge(recipe_with(local))
    other = {**served, "name": "rm2", "base_url": "http://127.0.0.1:8101/v1"}
    with pytest.raises(ValueError, match="--name"):
        served_judge(recipe_with(served, other))
    assert served_judge(recipe_with(served, other), "rm2")[1] == ("127.0.0.1", 8101)
    assert served_judge({"data": {"env": [{"id": "e", "judge": [local, served]}]}})[0].name == "rm"  # a list
    for bad in ("https://127.0.0.1:8100/v1", "http://127.0.0.1/v1", "http://127.0.0.1:8100/api"):
        with pytest.raises(ValueError, match="judge.base_url"):
            address_of(bad)
