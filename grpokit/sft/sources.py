"""Where SFT examples come from: a file or folder of records (JSONL, JSON, Parquet, CSV, a
`datasets.save_to_disk` folder) mapped to chats by `data.fields`, or an environment's own reference
answers (`data.env`), so a recipe needs no file.

Each example becomes a chat (a list of messages) and the tool schemas its template lists, if any:
- `messages`: the chat as it is (multi-turn; assistant `tool_calls` and `tool` results included);
- `prompt` + `completion`: a string is one user (prompt) or assistant (completion) message, a list is
  messages (TRL's conversational prompt-completion format); the chat is prompt + completion;
- an environment's example: its prompt messages (system prompt, prompt) + one assistant message,
  `answer_template` with `{answer}` replaced by the task's `answer_field` (reverse-text, arithmetic and
  jsonl keep the reply that earns full reward as `answer`; as data.expert reads it).

`key` names the recipe section that holds `path` and `fields` in errors: `data` (`grpokit sft`) or
`data.expert` (Chord's SFT dataset in `grpokit fit`). ShuffledPasses is the seeded order both draw in.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grpokit.environments import Environment, EnvSpec

Chat = tuple[list[dict[str, Any]], list[dict] | None]  # messages, tool schemas
SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")


@dataclass
class SFTFields:
    """Which fields of a record hold the example (the field mapping).

    Args:
        messages: the chat: a list of {role, content} messages (assistant `tool_calls`, `tool` results).
        prompt: with `completion`, when the record has no `messages` field: a string (one user message)
            or a list of messages.
        completion: the reply: a string (one assistant message) or a list of messages.
        tools: tool schemas for the chat template (optional; a record without the field has none).
    """

    messages: str = "messages"
    prompt: str = "prompt"
    completion: str = "completion"
    tools: str = "tools"


def read_records(path: str, split: str = "train", key: str = "data") -> list[dict[str, Any]]:
    """The records of a file (by its suffix) or of a `datasets.save_to_disk` folder (`split` of a
    DatasetDict)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"{key}.path {path!r}: no such file or folder")
    if p.is_dir():
        return _dataset_folder(p, split, key)
    if p.suffix == ".jsonl":
        with open(p) as f:
            return [_json(line, p, i, key) for i, line in enumerate(f) if line.strip()]
    if p.suffix == ".json":
        records = json.loads(p.read_text())
        return records if isinstance(records, list) else [records]
    if p.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(p).to_pylist()
    if p.suffix == ".csv":
        with open(p, newline="") as f:
            return list(csv.DictReader(f))
    raise ValueError(f"{key}.path {path!r}: read are {', '.join(SUFFIXES)} files and datasets.save_to_disk folders")


def _json(line: str, path: Path, i: int, key: str) -> dict:
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{key}.path {str(path)!r} line {i + 1} is not JSON: {e}") from e


def _dataset_folder(folder: Path, split: str, key: str) -> list[dict]:
    try:
        from datasets import DatasetDict, load_from_disk
    except ImportError as e:
        raise ImportError(f"{key}.path {str(folder)!r} is a folder: reading it needs `pip install datasets`") from e
    data = load_from_disk(str(folder))
    if isinstance(data, DatasetDict):
        if split not in data:
            raise ValueError(f"{key}.split {split!r}: {folder} has the splits {sorted(data)}; set {key}.split")
        data = data[split]
    return data.to_list()


def record_chats(records: list[dict], fields: SFTFields, source: str, key: str = "data") -> list[Chat]:
    """Each record as a chat, by `fields`; ValueError naming the key and the fields the data has."""
    if not records:
        raise ValueError(f"{source} holds no examples")
    chats = []
    for i, record in enumerate(records):
        if _has(record, fields.messages):
            messages = _listed(record[fields.messages], f"{source} example {i}", f"{key}.fields.messages")
        elif _has(record, fields.prompt) and _has(record, fields.completion):
            messages = _turns(record[fields.prompt], "user", key) + _turns(record[fields.completion], "assistant", key)
        else:
            raise ValueError(
                f"{source} example {i} has neither {key}.fields.messages ({fields.messages!r}) nor "
                f"{key}.fields.prompt and {key}.fields.completion ({fields.prompt!r}, {fields.completion!r}); "
                f"its fields are {sorted(record)}: map them with {key}.fields (e.g. {key}.fields.messages: "
                "conversations)"
            )
        tools = record.get(fields.tools) or None
        chats.append((messages, _listed(tools, f"{source} example {i}", f"{key}.fields.tools") if tools else None))
    return chats


def _has(record: dict, field: str) -> bool:
    return record.get(field) not in (None, "")


def _listed(value: Any, where: str, key: str) -> list:
    """A list field (`key`: its recipe key), which a CSV file holds as JSON text."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: {key} is a string but not a JSON list: {e}") from e
    if not isinstance(value, list):
        raise ValueError(f"{where}: {key} must be a list, got {type(value).__name__}")
    return value


def _turns(value: Any, role: str, key: str) -> list[dict]:
    """A prompt or completion: a string is one message of `role` (unless it is a JSON list of messages,
    as a CSV file holds them); a list is messages as they are."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.lstrip().startswith("[") else value
        except json.JSONDecodeError:
            pass
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    return _listed(value, f"a {role} field", f"{key}.fields." + ("prompt" if role == "user" else "completion"))


class ShuffledPasses:
    """Positions 0, 1, 2, ... of an endless sequence of shuffled passes over `n` items, pass e a
    permutation seeded by (seed, e): a function of the position, so a resumed run draws exactly what the
    killed one would have."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed = n, seed
        self._orders: dict[int, list[int]] = {}

    def take(self, start: int, count: int) -> list[int]:
        """The items at positions start .. start + count - 1."""
        out = []
        for position in range(start, start + count):
            epoch = position // self.n
            if epoch not in self._orders:
                g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
                self._orders = {epoch: torch.randperm(self.n, generator=g).tolist()}  # one pass kept at a time
            out.append(self._orders[epoch][position % self.n])
        return out


def environment_chats(specs: list[EnvSpec], answer_field: str, answer_template: str) -> list[Chat]:
    """Each environment example's prompt followed by its reference answer as the assistant's reply."""
    chats = []
    for spec in specs:
        env = Environment(spec)
        for example in env.examples:
            data = example.task.data
            if not hasattr(data, answer_field):
                raise ValueError(
                    f"data.answer_field is {answer_field!r}, but environment {env.name!r} example "
                    f"{example.index} has no such field in its task data: set data.answer_field to the "
                    "field holding its reference answer (e.g. answer, solution)"
                )
            reply = answer_template.format(answer=getattr(data, answer_field))
            chats.append(([*example.messages, {"role": "assistant", "content": reply}], None))
    return chats
