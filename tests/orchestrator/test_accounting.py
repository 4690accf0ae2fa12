"""Prompt accounting (grpokit.orchestrator.accounting): prompts.jsonl names, for every position of the data
order, the step that trained it or the rule that dropped it; `audit` proves each is accounted exactly once.

The streamed resume test is the regression test of a skipped-and-doubled prompt (NeMo-RL#3599,
OpenRLHF#1322): a stream draws ahead of its steps and groups finish out of order, so when a step's batch
is handed out some earlier prompts are still in flight while later ones were trained. A resume that
restarted the stream at its generation's block trained the later ones again and never the earlier ones.
"""

from __future__ import annotations

import json

import pytest

from grpokit.main import main
from grpokit.orchestrator import accounting
from grpokit.orchestrator.driver import fitting_places
from grpokit.testing import tiny_fit_argv


def write(run, *records) -> None:
    (run / accounting.RECORD).write_text("".join(json.dumps(r) + "\n" for r in records))


def line(step: int, trained: list[int], **dropped) -> dict:
    return {"step": step, "generation": step, "iteration": 0, "trained": trained, "dropped": dropped}


def test_audit_counts_each_position_once_by_the_last_line_of_each_step(tmp_path):
    write(
        tmp_path,
        line(0, [0, 2], filtered=[1]),
        line(1, [5, 4]),  # a killed run's step 1, made again below: the last line wins
        line(1, [3, 4], too_long=[5]),
        {"step": None, "unfinished": [6]},
    )
    counts = accounting.audit(tmp_path, 2)
    assert counts == {**counts, "trained": 4, "filtered": 1, "too_long": 1, "unfinished": 1}
    assert accounting.accounted_before(tmp_path, 1) == {0, 1, 2}


@pytest.mark.parametrize(
    ("records", "error"),
    [
        ([line(0, [0, 1]), line(1, [1, 2])], "prompt 1 of the data order is trained at step 0 and again trained"),
        ([line(0, [0, 1]), line(1, [3, 4])], r"prompts \[2\] of the data order were never trained"),
        ([line(0, [0, 1])], r"no line for steps \[1\]"),
        ([line(0, [0], surplus=[0]), line(1, [1])], "is trained at step 0 and again surplus"),
    ],
)
def test_audit_names_a_doubled_or_skipped_prompt(tmp_path, records, error):
    write(tmp_path, *records)
    with pytest.raises(AssertionError, match=error):
        accounting.audit(tmp_path, 2)


def test_a_partial_last_line_is_cut_before_the_next_append(tmp_path):
    write(tmp_path, line(0, [0]))
    with open(tmp_path / accounting.RECORD, "a") as f:
        f.write('{"step": 1, "trai')  # killed mid-write
    accounting.repair(tmp_path)
    accounting.append_record(tmp_path, line(1, [1]))
    assert accounting.audit(tmp_path, 2)["trained"] == 2


def test_a_group_id_is_its_prompt_position_even_after_too_long_prompts():
    items = [("env", f"ex{i}") for i in range(5)]
    assert fitting_places(items, [items[1], items[2], items[4]]) == [1, 2, 4]


def test_rules_that_drop_groups_are_named(tmp_path, tiny_model):
    """Oversampling, dynamic sampling and its resampling rounds: every prompt drawn or reserved is trained
    once or dropped by a named rule."""
    buffer = "{dynamic_sampling: true, max_resample_times: 1, oversampling_factor: 1.5}"
    argv = tiny_fit_argv(tmp_path, tiny_model, "rules", "--trainer.max_steps", "3", "--data.buffer", buffer)
    assert main(argv + ["--data.eval", "null"]) == 0
    counts = accounting.audit(tmp_path / "rules", 3)
    # a generation reserves 2 rounds of 3 prompts (2 needed x 1.5) and trains 2: every one of the 18 is named
    assert counts["trained"] == 3 * 2 and sum(counts.values()) == 3 * 2 * 3, counts
    assert counts["surplus"] + counts["filtered"] >= 3 and counts["unused_round"] % 3 == 0, counts


def test_a_resumed_stream_trains_each_prompt_once(tmp_path, tiny_model):
    """Streamed (max_inflight 6, async 1, completions of different lengths): resumed at a step where the
    prompts trained so far are not a prefix of the data order, every prompt is still trained once."""
    argv = tiny_fit_argv(
        tmp_path,
        tiny_model,
        "stream",
        *("--trainer.max_steps", "6", "--ckpt.interval", "1", "--ckpt.keep_last", "10", "--data.eval", "null"),
        *("--data.sampling.stop", "[e]", "--data.streaming", "{max_inflight: 6}"),
    )
    assert main(argv) == 0
    run = tmp_path / "stream"
    accounting.audit(run, 6)
    out_of_order = [s for s in range(1, 6) if (done := accounting.accounted_before(run, s)) != set(range(len(done)))]
    assert out_of_order, (run / accounting.RECORD).read_text()  # the case at stake: seen at step 1 when written
    assert main(argv + ["--ckpt.resume_step", str(out_of_order[0])]) == 0
    counts = accounting.audit(run, 6)
    assert counts["trained"] == 6 * 2
