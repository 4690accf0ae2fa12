"""jsonl: question/answer rows from a JSONL file, scored by exact match or math equivalence.

Each non-blank line of `path` is a JSON object; `input_key` (default "question") is the prompt and
`output_key` (default "answer") the reference. `num_tasks` keeps the first rows (all when unset). A
missing file, a line that is not UTF-8 or not a JSON object, or a row without a key is an error naming
the file, line and key. envs/jsonl/example.jsonl (installed next to this module, `EXAMPLE_PATH`) shows the format.

Reward `correct`, chosen by `task.match`:
- "exact": 1.0 when the stripped reply equals the stripped answer.
- "math": 1.0 when math_verify finds the reply equivalent to the answer (`verify(parse(answer),
  parse(reply))`; the answer is read as LaTeX, the reply's \\boxed{} or last expression is used).
  math_verify's timeouts use SIGALRM, which only works in the main thread; in grpokit fit the rollout
  loop scores in a background thread, so there the check runs without a timeout.

There is no system prompt by default; verifiers' shared `system_prompt` arg (a file whose text becomes
every task's system prompt) sets one, as for any taskset.

Args (recipe `data.env: [{id: jsonl, args: {path: data/train.jsonl, task: {match: math}}}]`): path,
input_key, output_key, num_tasks, system_prompt (a file), task.match.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import verifiers.v1 as vf

EXAMPLE_PATH = Path(__file__).with_name("example.jsonl")
MATH_TIMEOUT_S = 5


def read_rows(path: Path, input_key: str, output_key: str, num_tasks: int | None) -> Iterator[tuple[int, str, str]]:
    """(line number, input, output) for the first `num_tasks` rows of `path`."""
    if not path.is_file():
        raise FileNotFoundError(f"jsonl: no file {path} (a relative path is read from {Path.cwd()})")
    with path.open(encoding="utf-8", errors="surrogateescape") as f:  # bad bytes are reported per line below
        rows = 0
        for lineno, line in enumerate(f, start=1):
            if num_tasks is not None and rows >= num_tasks:
                return
            check_utf8(line, path, lineno)
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"jsonl: {path} line {lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"jsonl: {path} line {lineno}: expected a JSON object, got {type(row).__name__}")
            question = row_text(row, input_key, "input_key", path, lineno)
            yield lineno, question, row_text(row, output_key, "output_key", path, lineno)
            rows += 1


def check_utf8(line: str, path: Path, lineno: int) -> None:
    """Refuse a line holding bytes that are not UTF-8. Read with errors="surrogateescape", each such byte
    is a lone surrogate (U+DC80..U+DCFF), which valid UTF-8 never decodes to; Python's own error would
    name neither the file nor the line."""
    try:
        line.encode("utf-8")
    except UnicodeEncodeError as e:
        byte = ord(line[e.start]) - 0xDC00
        raise ValueError(
            f"jsonl: {path} line {lineno}: not UTF-8 (byte 0x{byte:02x} at character {e.start + 1}); "
            "save the file as UTF-8"
        ) from None


def row_text(row: dict, key: str, arg: str, path: Path, lineno: int) -> str:
    """row[key] as text; a number is accepted and written as JSON writes it."""
    if key not in row:
        raise ValueError(f"jsonl: {path} line {lineno}: no key {key!r} ({arg}); the row has keys {sorted(row)}")
    value = row[key]
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(
            f"jsonl: {path} line {lineno}: key {key!r} holds {type(value).__name__}, expected a string or number"
        )
    return value if isinstance(value, str) else json.dumps(value)


def math_equal(reply: str, answer: str) -> bool:
    """math_verify equivalence of the reply to the answer (read as LaTeX unless it already has $ or \\boxed)."""
    from math_verify import parse, verify

    timeout = MATH_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    gold = parse(answer if "$" in answer or "\\boxed" in answer else f"${answer}$", parsing_timeout=timeout)
    pred = parse(reply, parsing_timeout=timeout)
    return bool(gold and pred and verify(gold, pred, timeout_seconds=timeout))


class JsonlData(vf.TaskData):
    answer: str


class JsonlTaskConfig(vf.TaskConfig):
    match: Literal["exact", "math"] = "exact"


class JsonlTask(vf.Task[JsonlData, vf.State, JsonlTaskConfig]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        reply = trace.last_reply or ""
        if self.config.match == "math":
            return float(math_equal(reply, self.data.answer))
        return float(reply.strip() == self.data.answer.strip())


class JsonlConfig(vf.TasksetConfig):
    task: JsonlTaskConfig = JsonlTaskConfig()
    path: Path
    input_key: str = "question"
    output_key: str = "answer"
    num_tasks: int | None = None


class JsonlTaskset(vf.Taskset[JsonlTask, JsonlConfig]):
    def load(self):
        c = self.config
        for lineno, question, answer in read_rows(c.path, c.input_key, c.output_key, c.num_tasks):
            yield JsonlTask(JsonlData(prompt=question, answer=answer, id=f"{c.path.name}:{lineno}"), c.task)


__all__ = ["JsonlTaskset"]
