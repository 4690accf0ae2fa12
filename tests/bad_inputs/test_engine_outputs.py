"""What an engine may hand back that is not a normal completion: no tokens at all, NaN or infinite
logprobs, mismatched lengths, an answer that is not JSON. The peer is a real loopback HTTP server
(tests.support.ScriptedServer) answering RemoteEngine's requests."""

import math

import pytest
import torch

from grpokit.common.models import load_tokenizer
from grpokit.environments.environment import Environment, EnvSpec
from grpokit.inference import SamplingSettings
from grpokit.inference.remote import RemoteEngine
from grpokit.orchestrator.group_play import generate_rollouts
from grpokit.orchestrator.packing import pack
from grpokit.orchestrator.stats import batch_metrics
from grpokit.registry.advantages.group_norm import GroupNorm
from tests.support import ScriptedServer


def choice(index: int, token_ids: list[int], logprobs: list[float]) -> dict:
    return {"index": index, "token_ids": token_ids, "logprobs": {"token_logprobs": logprobs}, "finish_reason": "stop"}


def rollouts_from(answer, tiny_model):
    env = Environment(EnvSpec(id="reverse-text", args={"num_tasks": 2}))
    with ScriptedServer([answer]) as server:
        engine = RemoteEngine(base_url=server.url, max_retries=0)
        engine.setup(tiny_model)
        [group] = generate_rollouts(
            engine, load_tokenizer(tiny_model), [(env, env.examples[0])], 3, SamplingSettings(max_tokens=4), 0
        )
    return group


def test_empty_and_nonfinite_completions_pack_into_a_finite_batch(tiny_model, caplog):
    answer = {
        "weight_step": 0,
        "choices": [
            choice(0, [], []),  # the engine stopped before any token
            choice(1, [42, 43], [float("nan"), -0.5]),
            choice(2, [44, 45, 46], [-0.1, float("-inf"), -0.3]),
        ],
    }
    empty, nan, inf = rollouts_from(answer, tiny_model)
    assert (empty.completion_ids, empty.completion_mask) == ([], [])
    for r in (nan, inf):  # kept for its reward (the group baseline), masked out of the loss, counted
        assert r.completion_mask == [0] * len(r.completion_ids) and r.completion_logprobs == [0.0] * len(
            r.completion_ids
        )
        assert r.metrics["nonfinite_logprobs"] == 1.0
    assert "the engine returned 1 non-finite logprobs of 2; the completion is masked out of the loss" in caplog.text
    group = [empty, nan, inf]
    advantages = GroupNorm().token_advantages([group])
    [mb] = pack(group, advantages, [True] * 3, seq_len=512)
    for name, t in vars(mb).items():
        assert not isinstance(t, torch.Tensor) or not t.is_floating_point() or torch.isfinite(t).all(), name
    assert mb.loss_mask_T.sum() == 0  # nothing of these three is trained on
    metrics = batch_metrics(0, group, torch.tensor([[r.reward for r in group]], dtype=torch.float64), {})
    assert metrics["env/nonfinite_logprobs"] == pytest.approx(2 / 3) and all(math.isfinite(v) for v in metrics.values())


def test_token_ids_and_logprobs_of_different_lengths_are_refused(tiny_model):
    with pytest.raises(
        ValueError, match="server answered 2 token ids but 1 logprobs: it must support logprobs and return_token_ids"
    ):
        rollouts_from({"choices": [choice(i, [5, 6], [-0.5]) for i in range(3)]}, tiny_model)


@pytest.mark.parametrize(
    "body", [b"<html>502 Bad Gateway</html>", ["not", "an", "answer"]], ids=["not JSON", "not an answer"]
)
def test_an_answer_that_is_not_a_completions_answer_names_the_server(tiny_model, body):
    with ScriptedServer([body]) as server:
        engine = RemoteEngine(base_url=server.url, max_retries=0)
        engine.setup(tiny_model)
        with pytest.raises(ValueError, match=f"inference server {server.url} answered .*: not a completions answer"):
            engine.generate([[1]], 1, SamplingSettings())
