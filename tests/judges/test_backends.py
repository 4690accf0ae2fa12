"""Where a judge runs, on the tiny random model: its own builtin engine in this process (greedy, equal to
transformers' greedy decode), a real `grpokit infer` server (the same reply over HTTP), a dead port and a
server too slow for the timeout (counted failures, not exceptions)."""

import pytest
import torch

from grpokit.judges.backends import BuiltinJudge, HTTPJudge
from tests.judges.helpers import dead_url
from tests.support.servers import serving, slow_forwards

PROMPTS = ["Grade this reply: 'olleh'. Score: N from 0 to 10.", "Is 2 + 2 = 4? Verdict: yes or no."]


@pytest.fixture(scope="module")
def builtin_judge(tiny_model):
    judge = BuiltinJudge(tiny_model, max_tokens=8, device="cpu")
    judge.setup()
    return judge


@pytest.fixture(scope="module")
def server(tiny_model):
    with serving(tiny_model, model_name="tiny") as (engine, served):
        yield engine, served


def test_the_builtin_judge_is_greedy_frozen_and_its_own_model(builtin_judge):
    replies = builtin_judge.ask(PROMPTS)  # one batch
    engine = builtin_judge.engine
    assert not any(p.requires_grad for p in engine.model.parameters())
    for prompt, reply in zip(PROMPTS, replies):
        ids = builtin_judge.prompt_ids(prompt)
        with torch.no_grad():
            out = engine.model.generate(
                torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=8, do_sample=False, pad_token_id=engine.tokenizer.pad_token_id,
            )  # fmt: skip
        assert reply.failure is None
        assert reply.text == engine.tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True)
    assert builtin_judge.ask(PROMPTS) == replies  # greedy: the same replies again


def test_the_builtin_judge_times_out_as_an_outcome(builtin_judge):
    slow = BuiltinJudge(builtin_judge.model, max_tokens=8, timeout=0.05, device="cpu")
    slow.engine = builtin_judge.engine
    with slow_forwards(slow.engine, 0.05):
        replies = slow.ask(PROMPTS)
    assert [r.failure for r in replies] == ["timeout", "timeout"] and "judge.timeout" in replies[0].detail


def test_the_http_judge_asks_a_grpokit_server(server, builtin_judge):
    judge = HTTPJudge(server[1].url, "tiny", max_tokens=8, timeout=60, retries=0)
    replies = judge.ask(PROMPTS)
    assert [r.failure for r in replies] == [None, None]
    assert [r.text for r in replies] == [r.text for r in builtin_judge.ask(PROMPTS)]  # same model, both greedy


def test_the_http_judge_sends_the_key_from_the_environment(monkeypatch):
    from tests.support.servers import ScriptedServer

    monkeypatch.setenv("JUDGE_KEY_FOR_TEST", "sk-test")
    with ScriptedServer([{"choices": [{"message": {"role": "assistant", "content": "Score: 9"}}]}]) as scripted:
        replies = HTTPJudge(scripted.url, "judge", api_key_var="JUDGE_KEY_FOR_TEST", retries=0).ask(["p"])
    assert replies[0].text == "Score: 9"
    assert scripted.request_headers[0]["Authorization"] == "Bearer sk-test"
    body = scripted.request_bodies[0]
    assert body["temperature"] == 0 and body["messages"] == [{"role": "user", "content": "p"}]
    with pytest.raises(ValueError, match="NOT_SET_JUDGE_KEY"):
        HTTPJudge(scripted.url, "judge", api_key_var="NOT_SET_JUDGE_KEY")


def test_a_dead_endpoint_is_down_after_bounded_retries():
    replies = HTTPJudge(dead_url(), "judge", timeout=5, retries=1).ask(PROMPTS)
    assert [r.failure for r in replies] == ["down", "down"] and "after 2 tries" in replies[0].detail


def test_a_server_past_the_timeout_is_a_timeout(server):
    engine, served = server
    with slow_forwards(engine, 0.3):
        replies = HTTPJudge(served.url, "tiny", max_tokens=8, timeout=0.2, retries=0).ask(PROMPTS[:1])
    assert replies[0].failure == "timeout"


def test_an_answer_that_is_not_a_chat_completion_is_down():
    from tests.support.servers import ScriptedServer

    with ScriptedServer([{"choices": []}]) as scripted:
        replies = HTTPJudge(scripted.url, "judge", retries=0).ask(["p"])
    assert replies[0].failure == "down" and "not a chat completion" in replies[0].detail
