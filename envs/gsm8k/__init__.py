"""gsm8k: the shipped sample of 200 GSM8K-style word problems (160 train, 40 eval), scored by the final number.

The problems are made up in envs/gsm8k/generate.py (one or two steps, small whole numbers; no GSM8K
text) and stored next to this module as train.jsonl and eval.jsonl, one {"question", "answer"} object a
line, the answer a worked solution ending in `#### N` as in GSM8K. `split` picks the file. The task and
its reward are the `dataset` environment's (envs/dataset/task.py: `task.match` gsm8k by default, the
number in the reply's last \\boxed{}, else after its `####`, else its last number, against N;
`task.format_weight`, `task.require_format`), without its need for the `datasets` package. For the real
GSM8K (or any Parquet / save_to_disk copy), use the `dataset` env.

What scores: the prompt asks for the answer in \\boxed{}, but by default a bare number ("18") or a
number ending prose ("so 18 apples") scores 1.0 as well, through the last-number fallback; of several
numbers the boxed one counts, else the one after `####`, else the last. `task.require_format: true` makes
the format required (a right number without \\boxed{} or `####` scores 0).

Args (recipe `data.env: [{id: gsm8k, args: {split: train}}]`): split, num_tasks, system_prompt (a
file replacing SYSTEM_PROMPT), task.match, task.format_weight, task.require_format.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import verifiers.v1 as vf
from pydantic import Field

from grpokit.envs.dataset.task import AnswerData, AnswerTask, AnswerTaskConfig, check_answer
from grpokit.envs.jsonl import read_rows

SYSTEM_PROMPT = "Solve the math word problem. Give the final answer as a number in \\boxed{}."
HERE = Path(__file__).parent


class GSM8KConfig(vf.TasksetConfig):
    task: AnswerTaskConfig = AnswerTaskConfig()
    split: Literal["train", "eval"] = "train"
    num_tasks: int | None = Field(default=None, ge=1)


class GSM8KTaskset(vf.Taskset[AnswerTask, GSM8KConfig]):
    def load(self):
        c = self.config
        path = HERE / f"{c.split}.jsonl"
        for lineno, question, answer in read_rows(path, "question", "answer", c.num_tasks):
            check_answer(c.task.match, answer, f"gsm8k: {path} line {lineno}")
            data = AnswerData(
                prompt=question, answer=answer, system_prompt=SYSTEM_PROMPT, id=f"gsm8k-{c.split}-{lineno}"
            )
            yield AnswerTask(data, c.task)


__all__ = ["GSM8KTaskset"]
