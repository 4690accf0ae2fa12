"""Easy/hard pools, dedup by hash_keys and skip_verification: config errors, crafted rewards, resume."""

import json
import random

import pytest

from grpokit.environments.environment import Environment, EnvSpec, UnscoredEnvironment
from grpokit.orchestrator.buffer import BufferSettings
from grpokit.orchestrator.pools import DifficultyPools, hash_key, read_log, restart_log
from grpokit.orchestrator.prompts import PromptSampler, index_key
from tests.support import read_metrics


@pytest.fixture(scope="module")
def env():
    return Environment(EnvSpec(id="reverse-text", args={"num_tasks": 6}))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"easy_threshold": 0.5, "hard_threshold": 0.5},
            r"easy_threshold \(0.5\) must be > data.buffer.hard_threshold \(0.5\)",
        ),
        ({"easy_threshold": 0.9, "easy_fraction": 1.5}, r"easy_fraction must be in \[0, 1\]"),
        ({"hard_fraction": 0.5}, "hard_fraction is set but data.buffer.hard_threshold is not"),
        ({"hash_keys": []}, "hash_keys must name at least one example field"),
        (
            {"skip_verification": True, "online_difficulty_filtering": True},
            "skip_verification leaves every reward 0, so data.buffer.online_difficulty_filtering",
        ),
        ({"skip_verification": True, "dynamic_sampling": True}, "data.buffer.dynamic_sampling cannot work"),
        ({"skip_verification": True, "hard_threshold": 0.0}, "data.buffer.hard_threshold cannot work"),
    ],
)
def test_invalid_buffer_settings_name_the_keys(settings, message):
    with pytest.raises(ValueError, match=message):
        BufferSettings(**settings)


def test_pool_of_checks_easy_first_and_both_bounds_inclusive():
    rules = BufferSettings(easy_threshold=0.75, hard_threshold=0.25)
    assert [rules.pool_of(r) for r in (1.0, 0.75, 0.5, 0.25, 0.0)] == ["easy", "easy", "normal", "hard", "hard"]
    assert BufferSettings(easy_threshold=0.0).pool_of(-1.0) == "normal" and not BufferSettings().uses_pools


def test_pools_move_once_and_only_count_from_the_next_generation(tmp_path):
    pools = DifficultyPools(BufferSettings(easy_threshold=0.9, hard_threshold=0.1), tmp_path / "buffer.jsonl", seed=0)
    pools.resume(0)
    assert (
        pools.observe(0, "a", 1.0) == "easy"
        and pools.observe(0, "b", 0.0) == "hard"
        and pools.observe(0, "c", 0.5) == "normal"
    )
    assert pools.observe(1, "a", 0.0) == "hard"  # classified, but an example already in a pool stays where it is
    assert pools.excluded(0) == set() and pools.excluded(1) == {"a", "b"}
    assert pools.sizes() == {"pool/easy": 1.0, "pool/hard": 1.0}
    assert read_log(tmp_path / "buffer.jsonl") == [
        {"generation": 0, "key": "a", "pool": "easy"},
        {"generation": 0, "key": "b", "pool": "hard"},
    ]


def write_log(path, events, tail=""):
    path.write_text("".join(json.dumps(e) + "\n" for e in events) + tail)


def test_resume_keeps_earlier_generations_and_drops_a_torn_line(tmp_path):
    path = tmp_path / "buffer.jsonl"
    write_log(path, [{"generation": g, "key": f"k{g}", "pool": "hard"} for g in range(5)], tail='{"generation": 5, "ke')
    pools = DifficultyPools(BufferSettings(hard_threshold=0.0), path, seed=0)
    assert pools.resume(3) == {"easy": 0, "hard": 0}
    assert pools.excluded(3) == {"k0", "k1", "k2"} and [e["key"] for e in read_log(path)] == ["k0", "k1", "k2"]
    assert DifficultyPools(BufferSettings(hard_threshold=0.0), path, seed=0).resume(3, restore=False) == {
        "easy": 0,
        "hard": 0,
    }  # skip_buffer
    assert read_log(path) == []


def test_resume_returns_the_configured_fraction_of_each_pool(tmp_path):
    path = tmp_path / "buffer.jsonl"
    events = [{"generation": 0, "key": f"e{i}", "pool": "easy"} for i in range(10)] + [
        {"generation": 1, "key": f"h{i}", "pool": "hard"} for i in range(4)
    ]
    settings = BufferSettings(easy_threshold=0.9, hard_threshold=0.1, easy_fraction=0.3, hard_fraction=1.0)
    write_log(path, events)
    pools = DifficultyPools(settings, path, seed=7)
    assert pools.resume(2) == {"easy": 3, "hard": 4}
    excluded = pools.excluded(2)
    assert len(excluded) == 7 and all(k.startswith("e") for k in excluded)
    assert pools.excluded(1) == {f"e{i}" for i in range(10)}  # the returns count from the resumed generation on
    write_log(path, events)
    assert DifficultyPools(settings, path, seed=7).resume(2) and read_log(path) == pools.events  # seeded: same draw


def test_skip_progress_counts_restored_moves_as_made_before_the_new_start(tmp_path):
    path = tmp_path / "buffer.jsonl"
    write_log(path, [{"generation": 4, "key": "a", "pool": "easy"}, {"generation": 9, "key": "b", "pool": "easy"}])
    assert restart_log(path, 6) == 1  # restart the count at 0 with the pools of the checkpoint at generation 6
    pools = DifficultyPools(BufferSettings(easy_threshold=0.9), path, seed=0)
    pools.resume(0)
    assert pools.excluded(0) == {"a"} and read_log(path) == [{"generation": -1, "key": "a", "pool": "easy"}]
    assert restart_log(path, None) == 0 and read_log(path) == []  # with skip_buffer: none


def walk(sampler, pools, rewards, generations, count=2):
    """The orchestrator's loop on crafted rewards: each generation's example indices."""
    out = []
    for g in generations:
        prompts = sampler.take(g, count)
        for env, ex in prompts:
            pools.observe(g, sampler.key_of(env, ex), rewards[ex.index])
        out.append([ex.index for _, ex in prompts])
    return out


def test_easy_and_hard_examples_leave_the_prompt_order_and_a_resume_continues_it(env, tmp_path):
    rewards = {0: 1.0, 1: 0.5, 2: 0.0, 3: 0.5, 4: 0.5, 5: 0.6}  # 0 easy, 2 hard
    settings = BufferSettings(easy_threshold=0.9, hard_threshold=0.1)

    def run(path, generations, start=0):
        pools = DifficultyPools(settings, path, seed=0)
        pools.resume(start)
        return walk(PromptSampler([env], seed=3, excluded=pools.excluded), pools, rewards, generations)

    straight = run(tmp_path / "a.jsonl", range(8))
    first_epoch = [i for block in straight[:3] for i in block]
    assert sorted(first_epoch) == list(range(6))
    later = [i for block in straight[3:] for i in block]
    assert 0 not in later and 2 not in later and sorted(set(later)) == [1, 3, 4, 5]
    assert sorted(later[:4]) == [1, 3, 4, 5]  # each epoch of the remaining four is a permutation of them
    # kill after generation 4, resume at 4 from the log: the same prompts as the uninterrupted walk
    run(tmp_path / "b.jsonl", range(5))
    assert run(tmp_path / "b.jsonl", range(4, 8), start=4) == straight[4:]


def test_without_pools_or_keys_epoch_e_is_the_eth_seeded_shuffle(env):
    sampler = PromptSampler([env], seed=5)
    walked = [ex.index for b in range(6) for _, ex in sampler.take(b, 2)]
    expected = []
    for epoch in range(2):
        order = list(range(6))
        random.Random(5 * 7919 + epoch).shuffle(order)
        expected += order
    assert walked == expected


def test_hash_keys_dedup_equal_examples_and_name_missing_fields(env):
    by_system_prompt = hash_key(["env", "system_prompt"])  # every reverse-text task has the same system prompt
    assert len({by_system_prompt(env, ex) for ex in env.examples}) == 1
    sampler = PromptSampler([env], seed=0, key=by_system_prompt)
    assert [ex.index for _, ex in sampler.take(3, 2)] == [0, 0]  # one example left: every epoch is that one
    by_answer = hash_key(["answer"])
    assert len({by_answer(env, ex) for ex in env.examples}) == len({ex.task.data.answer for ex in env.examples})
    with pytest.raises(
        ValueError, match=r"hash_keys names \['nope'\], which example 0 of environment 'reverse-text' lacks"
    ):
        hash_key(["nope"])(env, env.examples[0])
    assert index_key(env, env.examples[4]) == "reverse-text/4"


def test_an_exhausted_pool_is_an_error_naming_the_fix(env, tmp_path):
    pools = DifficultyPools(BufferSettings(hard_threshold=1.0), tmp_path / "buffer.jsonl", seed=0)
    pools.resume(0)
    with pytest.raises(
        ValueError,
        match="every example of all environments is in the easy or hard pool: lower data.buffer.easy_threshold",
    ):
        walk(PromptSampler([env], seed=0, excluded=pools.excluded), pools, {i: 0.0 for i in range(6)}, range(4))


def test_unscored_environment_rewards_zero_and_shares_examples(env):
    unscored = UnscoredEnvironment(env)
    assert unscored.examples is env.examples and unscored.name == env.name
    assert unscored.score(env.examples[:2], [env.examples[0].task.data.answer, "x"]) == [(0.0, {}), (0.0, {})]
    assert env.score(env.examples[:1], [env.examples[0].task.data.answer])[0][0] == 1.0


def fit(tmp_path, tiny_model, name, *overrides):

    from grpokit.main import main
    from grpokit.testing import tiny_fit_argv

    argv = tiny_fit_argv(
        tmp_path,
        tiny_model,
        name,
        "--data.eval",
        "null",
        "--data.num_logged_samples",
        "100",
        "--ckpt.interval",
        "0",
        *overrides,
    )
    assert main(argv) == 0
    rows = read_metrics(tmp_path / name)
    return rows, [json.loads(line) for line in open(tmp_path / name / "samples.jsonl")]


def test_skip_verification_end_to_end(tmp_path, tiny_model):
    rows, samples = fit(
        tmp_path, tiny_model, "unscored", "--data.buffer.skip_verification", "true", "--trainer.max_steps", "1"
    )
    assert [float(r["reward"]) for r in rows] == [0.0] and all(s["reward"] == 0.0 for s in samples)
    assert all(float(r["grad_norm"]) == 0.0 for r in rows)  # zero rewards: zero advantages


def test_hard_pool_end_to_end(tmp_path, tiny_model):
    # the tiny model never answers arithmetic (reward 0: hard) but always earns some reverse-text LCS credit;
    # 4 examples, 2 per step: epoch 0 is steps 0-1, after it (step 2) only the 2 reverse-text examples are sampled
    envs = '[{"id": "reverse-text", "args": {"num_tasks": 2}}, {"id": "arithmetic", "args": {"num_tasks": 2}}]'
    rows, samples = fit(
        tmp_path,
        tiny_model,
        "pools",
        "--data.env",
        envs,
        "--data.buffer.hard_threshold",
        "0.0",
        "--trainer.max_steps",
        "3",
    )
    moves = read_log(tmp_path / "pools" / "buffer.jsonl")
    assert sorted(m["key"] for m in moves) == ["arithmetic/0", "arithmetic/1"]
    assert all(m["pool"] == "hard" and m["generation"] < 2 for m in moves)
    assert {s["env"] for s in samples if s["step"] < 2} == {"reverse-text", "arithmetic"}
    assert {s["env"] for s in samples if s["step"] >= 2} == {"reverse-text"}
    assert [float(r["pool/hard"]) for r in rows][-1] == 2.0
