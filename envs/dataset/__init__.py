"""dataset: question/answer rows of a local Parquet, JSONL or CSV file or a `datasets` save_to_disk folder.

Rows are read with Hugging Face `datasets` (optional: `pip install datasets`, or `pip install
grpokit[datasets]`); nothing is downloaded. `path` is a file (.parquet, .jsonl, .json, .csv) or a
folder written by `Dataset.save_to_disk` / `DatasetDict.save_to_disk`. `split` picks a split of a
DatasetDict folder (default "train"); a file or a single Dataset has no splits, so `split` must stay
unset there. Fields: `prompt_field` is the question, `answer_field` the reference (a string or a
number), `system_field` (optional) a per-row system prompt. A missing path, an unreadable file, a
missing split or a missing column is an error naming the path and what it holds.

Prompt: the row's question; with `few_shot: k` the first k rows of the table are left out of the tasks
and shown before every question as "Question: ...\\nAnswer: ..." blocks (their full answers, so a
GSM8K answer's worked solution and `#### N` show the format), the question then following as
"Question: ...\\nAnswer:". A system prompt comes from `system_field`, else `system_prompt_text`, else
verifiers' shared `system_prompt` arg (a file; when set, it replaces the other two for every task).

Reward: envs/dataset/task.py (`task.match`: gsm8k, the default, exact or math; `task.format_weight`;
`task.require_format`). With match gsm8k a bare number or one ending prose scores like a \\boxed{} one
unless `task.require_format` is true.

Args (recipe `data.env: [{id: dataset, args: {path: data/gsm8k, split: test, task: {match: gsm8k}}}]`):
path, split, prompt_field, answer_field, system_field, system_prompt_text, few_shot, num_tasks, task.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import verifiers.v1 as vf
from pydantic import Field

from grpokit.envs.dataset.task import AnswerData, AnswerTask, AnswerTaskConfig, check_answer

LOADERS = {".parquet": "from_parquet", ".jsonl": "from_json", ".json": "from_json", ".csv": "from_csv"}
INSTALL_HINT = "pip install datasets (or pip install 'grpokit[datasets]')"


def import_datasets():
    try:
        import datasets
    except ImportError as e:
        raise ImportError(
            f"data.env id 'dataset' reads files with Hugging Face `datasets`, which is not installed: {INSTALL_HINT}"
        ) from e
    return datasets


def read_table(path: Path, split: str | None):
    """The `datasets.Dataset` at `path` (the `split` of a DatasetDict folder), named errors otherwise."""
    datasets = import_datasets()
    if not path.exists():
        raise FileNotFoundError(f"dataset: no file or folder {path} (a relative path is read from {Path.cwd()})")
    if path.is_dir():
        try:
            table = datasets.load_from_disk(str(path), keep_in_memory=True)
        except FileNotFoundError as e:
            raise ValueError(f"dataset: {path} is not a folder written by datasets' save_to_disk ({e})") from None
        if isinstance(table, datasets.DatasetDict):
            return pick_split(table, path, split or "train")
    else:
        loader = LOADERS.get(path.suffix.lower())
        if loader is None:
            raise ValueError(f"dataset: {path}: unknown file type; expected one of {', '.join(LOADERS)} or a folder")
        try:
            table = getattr(datasets.Dataset, loader)(str(path), keep_in_memory=True)
        except Exception as e:  # pyarrow, json and datasets' own errors: all mean the file cannot be read
            raise ValueError(f"dataset: cannot read {path} as {path.suffix} ({type(e).__name__}: {e})") from e
    if split is not None:
        raise ValueError(f"dataset: {path} is one table without splits; leave args.split unset (got {split!r})")
    return table


def pick_split(table, path: Path, split: str):
    if split not in table:
        raise ValueError(f"dataset: {path} has no split {split!r} (args.split); its splits are {sorted(table)}")
    return table[split]


def check_columns(table, fields: dict[str, str | None], where: str) -> None:
    """Each named field (arg -> column) is a column of `table`, or an error listing the columns."""
    for arg, column in fields.items():
        if column is not None and column not in table.column_names:
            raise ValueError(f"dataset: {where} has no column {column!r} ({arg}); its columns are {table.column_names}")


def cell_text(row: dict, column: str, where: str, index: int) -> str:
    """row[column] as text; a number is written as Python writes it."""
    value = row[column]
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(
            f"dataset: {where} row {index}: column {column!r} holds {type(value).__name__}, expected a string or number"
        )
    return value if isinstance(value, str) else str(value)


def prompt_text(question: str, shots: list[tuple[str, str]]) -> str:
    if not shots:
        return question
    blocks = [f"Question: {q}\nAnswer: {a}" for q, a in shots]
    return "\n\n".join([*blocks, f"Question: {question}\nAnswer:"])


class DatasetConfig(vf.TasksetConfig):
    task: AnswerTaskConfig = AnswerTaskConfig()
    path: Path
    split: str | None = None
    prompt_field: str = "question"
    answer_field: str = "answer"
    system_field: str | None = None
    system_prompt_text: str | None = None
    few_shot: int = Field(default=0, ge=0)
    num_tasks: int | None = Field(default=None, ge=1)


def rows(c: DatasetConfig) -> Iterator[tuple[int, str, str, str | None]]:
    """(row index, question, answer, system prompt) of the table's rows, few-shot rows included."""
    table = read_table(c.path, c.split)
    where = f"{c.path}" + (f" split {c.split!r}" if c.split else "")
    fields = {"prompt_field": c.prompt_field, "answer_field": c.answer_field, "system_field": c.system_field}
    check_columns(table, fields, where)
    for i, row in enumerate(table.select_columns([f for f in fields.values() if f])):
        question, answer = cell_text(row, c.prompt_field, where, i), cell_text(row, c.answer_field, where, i)
        system = cell_text(row, c.system_field, where, i) if c.system_field else c.system_prompt_text
        yield i, question, answer, system


def where_id(c: DatasetConfig) -> str:
    return c.path.name + (f":{c.split}" if c.split else "")


class DatasetTaskset(vf.Taskset[AnswerTask, DatasetConfig]):
    def load(self):
        c = self.config
        stop = None if c.num_tasks is None else c.few_shot + c.num_tasks
        shots = []
        for i, question, answer, system in rows(c):
            if i < c.few_shot:
                shots.append((question, answer))
                continue
            if stop is not None and i >= stop:
                return
            check_answer(c.task.match, answer, f"dataset: {c.path} row {i} (answer_field {c.answer_field!r})")
            data = AnswerData(
                prompt=prompt_text(question, shots), answer=answer, system_prompt=system, id=f"{where_id(c)}:{i}"
            )
            yield AnswerTask(data, c.task)


__all__ = ["DatasetTaskset"]
