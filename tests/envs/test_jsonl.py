"""jsonl: rows from a file, clear errors for bad files, exact and math_verify scoring via Environment.score."""

import json
import threading

import pytest

from grpokit.environments.environment import Environment, EnvSpec
from grpokit.envs.jsonl import EXAMPLE_PATH


def load(path=EXAMPLE_PATH, **args) -> Environment:
    return Environment(EnvSpec(id="jsonl", args={"path": str(path), **args}))


def write_rows(path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def test_example_file():
    env = load()
    assert len(env.examples) == 5
    assert env.examples[0].messages == [{"role": "user", "content": "What is 7 + 5?"}]
    assert [ex.task.data.answer for ex in env.examples] == ["12", "72", "3/4", "5", "12"]
    assert [ex.messages for ex in load().examples] == [ex.messages for ex in env.examples]
    assert len(load(num_tasks=2).examples) == 2


def test_keys_blank_lines_numbers_and_system_prompt(tmp_path):
    path = write_rows(tmp_path / "d.jsonl", [{"q": "1 + 1?", "a": 2, "extra": None}, "", {"q": "2 + 2?", "a": "4"}])
    (tmp_path / "system.txt").write_text("Answer with a number.")
    env = load(path, input_key="q", output_key="a", system_prompt=str(tmp_path / "system.txt"))
    assert [ex.messages for ex in env.examples] == [
        [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": "1 + 1?"}],
        [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": "2 + 2?"}],
    ]
    assert [ex.task.data.answer for ex in env.examples] == ["2", "4"]
    assert [ex.task.data.id for ex in env.examples] == ["d.jsonl:1", "d.jsonl:3"]


def test_exact_match():
    env = load()
    ex = env.examples[0]  # answer "12"
    replies = ["12", "  12\n", "13", "The answer is 12", "\\boxed{12}", ""]
    assert [r for r, _ in env.score([ex] * len(replies), replies)] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]


def test_math_match():
    env = load(task={"match": "math"})
    ex = env.examples[2]  # answer "3/4"
    replies = ["3/4", "The sum is \\boxed{\\frac{3}{4}}", "\\boxed{0.75}", "\\boxed{1/2}", "banana", ""]
    assert [r for r, _ in env.score([ex] * len(replies), replies)] == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]


def test_math_match_off_the_main_thread():
    """grpokit fit scores in a background thread, where math_verify's SIGALRM timeout cannot run."""
    env = load(task={"match": "math"})
    out = []
    thread = threading.Thread(target=lambda: out.extend(env.score(env.examples[2:4], ["\\boxed{0.75}", "x = 5"])))
    thread.start()
    thread.join()
    assert [r for r, _ in out] == [1.0, 1.0]


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load(tmp_path / "nope.jsonl")


def test_row_without_key(tmp_path):
    path = write_rows(tmp_path / "d.jsonl", [{"question": "a", "answer": "b"}, {"question": "c", "solution": "d"}])
    with pytest.raises(ValueError, match=r"d\.jsonl line 2: no key 'answer' \(output_key\)"):
        load(path)
    with pytest.raises(ValueError, match=r"d\.jsonl line 1: no key 'prompt' \(input_key\)"):
        load(path, input_key="prompt")


def test_bad_rows(tmp_path):
    with pytest.raises(ValueError, match=r"d\.jsonl line 2: not valid JSON"):
        load(write_rows(tmp_path / "d.jsonl", [{"question": "a", "answer": "b"}, "{oops"]))
    with pytest.raises(ValueError, match=r"e\.jsonl line 1: expected a JSON object"):
        load(write_rows(tmp_path / "e.jsonl", [["a", "b"]]))
    with pytest.raises(ValueError, match=r"f\.jsonl line 1: key 'answer' holds list"):
        load(write_rows(tmp_path / "f.jsonl", [{"question": "a", "answer": [1]}]))


def test_a_line_that_is_not_utf8_names_the_file_and_line(tmp_path):
    # "café" written as Latin-1: 0xe9 is not UTF-8; it is the 18th character of its line.
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"question": "a", "answer": "1"}\n{"question": "caf\xe9", "answer": "2"}\n')
    with pytest.raises(
        ValueError, match=r"latin1\.jsonl line 2: not UTF-8 \(byte 0xe9 at character 18\); save the file"
    ):
        load(path)
    assert len(load(path, num_tasks=1).examples) == 1  # rows past num_tasks are not read
