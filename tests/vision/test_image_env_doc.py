"""docs/environments.md's image environment (count_dots.py) and its recipe overlay, as written, trained by
`grpokit fit` on a tiny random Qwen2.5-VL: the page's file is imported by its id from a folder on sys.path,
its pictures go through the processor, the builtin engine and the trainer, and step 0 is token-faithful."""

from __future__ import annotations

import json
import sys

import yaml

from grpokit.main import main
from grpokit.testing import build_tiny_qwen2_5_vl, tiny_fit_argv
from tests.support import read_metrics
from tests.test_environments_doc import FILES


def test_the_pages_image_environment_trains(tmp_path, monkeypatch):
    (tmp_path / "count_dots.py").write_text(FILES["count_dots.py"])
    monkeypatch.syspath_prepend(str(tmp_path))
    overlay = yaml.safe_load(FILES["my_image_envs.yaml"])
    (dots,) = [e for e in overlay["data"]["env"] if e["id"] == "count-dots"]
    dots["args"]["num_tasks"] = 16
    model = str(build_tiny_qwen2_5_vl(tmp_path / "qwen"))
    argv = tiny_fit_argv(
        tmp_path, model, "dots", "--data.env", json.dumps([dots]), "--data.eval", "null",
        "--data.max_async_level", "0", "--data.seq_len", "256", "--trainer.max_steps", "1",
    )  # fmt: skip
    try:
        assert main(argv) == 0
    finally:
        sys.modules.pop("count_dots", None)
    (row,) = read_metrics(tmp_path / "dots")
    assert abs(float(row["token_mult_prob_error"]) - 1) < 1e-4
    samples = [json.loads(line) for line in open(tmp_path / "dots" / "samples.jsonl")]
    assert {s["env"] for s in samples} == {"count-dots"}
