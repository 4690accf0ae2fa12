"""gsm8k: the shipped sample (size, format, splits, arithmetic of every worked solution, regenerated
byte for byte by its generator) and its scoring through Environment.score."""

import json
import re

import pytest

from grpokit.environments.environment import Environment, EnvSpec
from grpokit.envs.dataset.answers import reference_answer
from grpokit.envs.gsm8k import HERE, SYSTEM_PROMPT
from grpokit.envs.gsm8k.generate import NUM_EVAL, NUM_TRAIN, write

STEP = re.compile(r"(\d+) ([-+*/]) (\d+) = \$?(\d+)")
OPS = {"+": int.__add__, "-": int.__sub__, "*": int.__mul__, "/": int.__floordiv__}


def rows(split: str) -> list[dict]:
    return [json.loads(line) for line in (HERE / f"{split}.jsonl").read_text().splitlines()]


def load(**args) -> Environment:
    return Environment(EnvSpec(id="gsm8k", args=args))


def test_the_sample_is_small_and_split():
    train, evals = rows("train"), rows("eval")
    assert (len(train), len(evals)) == (NUM_TRAIN, NUM_EVAL) == (160, 40)
    assert sum((HERE / f"{s}.jsonl").stat().st_size for s in ("train", "eval")) < 60_000
    questions = [r["question"] for r in train + evals]
    assert len(set(questions)) == 200  # distinct, so train and eval do not overlap


@pytest.mark.parametrize("split", ["train", "eval"])
def test_every_solution_is_worked_arithmetic_ending_in_its_answer(split):
    for row in rows(split):
        *steps, last = row["answer"].split("\n")
        assert re.fullmatch(r"#### \d+", last) and 1 <= len(steps) <= 2, row
        results = []
        for step in steps:
            (a, op, b, result), *_ = STEP.findall(step)
            assert OPS[op](int(a), int(b)) == int(result) and (op != "/" or int(a) % int(b) == 0), step
            results.append(int(result))
        assert reference_answer(row["answer"]) == results[-1] > 0, row


def test_the_generator_writes_the_shipped_files(tmp_path):
    write(tmp_path)
    for name in ("train.jsonl", "eval.jsonl"):
        assert (tmp_path / name).read_bytes() == (HERE / name).read_bytes(), name


def test_examples_and_splits():
    train, evals = load(), load(split="eval")
    assert (len(train.examples), len(evals.examples)) == (160, 40)
    assert train.examples[0].messages == [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": rows("train")[0]["question"]},
    ]
    assert len(load(num_tasks=5).examples) == 5
    with pytest.raises(ValueError, match="split"):
        load(split="test")


def test_scoring():
    env = load(split="eval")
    ex = env.examples[0]
    n = int(reference_answer(ex.task.data.answer))
    replies = [f"\\boxed{{{n}}}", f"So the answer is {n}.", f"#### {n}", f"\\boxed{{{n + 1}}}", "no idea"]
    scored = env.score([ex] * len(replies), replies)
    assert [r for r, _ in scored] == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert [m["formatted"] for _, m in scored] == [1.0, 0.0, 1.0, 1.0, 0.0]
    mixed = load(split="eval", task={"format_weight": 0.1})
    assert [r for r, _ in mixed.score([mixed.examples[0]] * 2, replies[1:3])] == [0.9, 1.0]
