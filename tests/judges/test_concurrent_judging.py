"""Judging while the engine generates (grpokit.judges.queue, grpokit.judges.deferred, GroupPlay): with a
slow judge, the engine decodes the next groups while the first is being judged, and the groups come out
in the order they finished, with exactly the rewards, metrics and notes of judging each group inline.
The judge's queue asks batches in order, merges waiting ones only when told to, and hands an error to
every group of the batch."""

import threading
import time

import pytest

from grpokit.environments.environment import Environment, EnvSpec
from grpokit.inference import SamplingSettings
from grpokit.inference.builtin import BuiltinEngine
from grpokit.judges import judged
from grpokit.judges.cache import JudgeCache
from grpokit.judges.queue import JudgeQueue
from grpokit.orchestrator.group_play import GroupPlay, PendingGroup
from grpokit.orchestrator.prompt_length import prompt_token_ids
from grpokit.orchestrator.rollouts import TurnLimits

GROUP, PROMPTS, JUDGE_SECONDS = 4, 4, 0.4


@pytest.fixture(scope="module")
def engine(tiny_model):
    engine = BuiltinEngine(device="cpu", fast="off")
    engine.setup(tiny_model)
    return engine


def exclaim_env(classifier: str, concurrent: bool) -> Environment:
    judge = {"kind": "classifier", "model": classifier, "name": "rm", "concurrent": concurrent}
    return judged(Environment(EnvSpec(id="exclaim", args={"num_tasks": 8}, judge=judge)), JudgeCache())


def play_groups(engine, env: Environment) -> tuple[list, list[tuple[float, float]], list[float]]:
    """Each prompt's group played one at a time in a stream of GROUP rows, the judge made JUDGE_SECONDS
    slower per batch; (the groups in the order handed out, each judge batch's (start, end), the times of
    the engine's forwards)."""
    sampling = SamplingSettings(temperature=1.0, max_tokens=6, seed=3)
    stream = engine.open_stream(sampling, GROUP, "continue", 256)
    play = GroupPlay(stream, engine, engine.tokenizer, GROUP, TurnLimits())
    score, batches = env.judges[0].backend.score, []

    def slow_score(conversations):
        start = time.monotonic()
        time.sleep(JUDGE_SECONDS)
        out = score(conversations)
        batches.append((start, time.monotonic()))
        return out

    env.judges[0].backend.score = slow_score
    forward, forwards = engine.model.forward, []

    def timed_forward(*args, **kwargs):
        forwards.append(time.monotonic())
        return forward(*args, **kwargs)

    engine.model.forward = timed_forward
    groups = []
    try:
        for g, example in enumerate(env.examples[:PROMPTS]):
            play.submit(PendingGroup(env, example, prompt_token_ids(engine.tokenizer, example), g, 100 + g))
        while play.open:
            groups.extend(play.advance())
    finally:
        del engine.model.forward
        play.close()
    return groups, batches, forwards


def test_the_engine_generates_while_a_group_is_judged(engine, tiny_classifier):
    concurrent, batches, forwards = play_groups(engine, exclaim_env(tiny_classifier, concurrent=True))
    inline, inline_batches, inline_forwards = play_groups(engine, exclaim_env(tiny_classifier, concurrent=False))
    start, end = batches[0]
    assert any(start < t < end for t in forwards), "no decode step ran while the first group was judged"
    assert not any(s < t < e for s, e in inline_batches for t in inline_forwards)  # inline: the engine waits
    assert [p.group_id for p, _ in concurrent] == [p.group_id for p, _ in inline] == list(range(PROMPTS))
    for (_, got), (_, want) in zip(concurrent, inline):
        assert [r.completion_ids for r in got] == [r.completion_ids for r in want]
        assert [r.reward for r in got] == [r.reward for r in want]  # bit for bit: the same batches were asked
        drop = "judge/rm/seconds"
        assert [{k: v for k, v in r.metrics.items() if k != drop} for r in got] == [
            {k: v for k, v in r.metrics.items() if k != drop} for r in want
        ]
        assert [r.notes for r in got] == [r.notes for r in want] and all("judge/rm/reply" in r.notes for r in got)
        assert all(r.reward == float(r.notes["judge/rm/reply"]) for r in got)  # the judge's score is the reward


def test_the_queue_asks_in_order_and_merges_only_when_told():
    gate, asked = threading.Event(), []

    def ask(conversations, labels):
        gate.wait(10)
        asked.append(list(labels))
        return [f"{label}!" for label in labels]

    for merge, expected in ((False, [["a"], ["b", "c"], ["d"]]), (True, [["a"], ["b", "c", "d"]])):
        gate.clear()
        asked.clear()
        queue = JudgeQueue(ask, merge=merge)
        futures = [queue.submit(["x"], ["a"])]
        time.sleep(0.1)  # the first batch is taken alone and waits at the gate; the rest queue behind it
        futures += [queue.submit(["x", "y"], ["b", "c"]), queue.submit(["x"], ["d"])]
        gate.set()
        assert [f.result(10) for f in futures] == [["a!"], ["b!", "c!"], ["d!"]]
        assert asked == expected


def test_an_error_in_a_merged_batch_reaches_every_group():
    gate = threading.Event()

    def ask(conversations, labels):
        gate.wait(10)
        if len(labels) > 1:
            raise RuntimeError("judge broke")
        return labels

    queue = JudgeQueue(ask, merge=True)
    first = queue.submit(["x"], ["a"])
    time.sleep(0.1)
    rest = [queue.submit(["x"], ["b"]), queue.submit(["x"], ["c"])]
    gate.set()
    assert first.result(10) == ["a"]
    for future in rest:
        with pytest.raises(RuntimeError, match="judge broke"):
            future.result(10)
