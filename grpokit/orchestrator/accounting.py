"""Prompt accounting: which prompts of the data order each step trained, and what happened to the others.

Every prompt the orchestrator draws has a position in the data order (grpokit.orchestrator.prompts:
block b holds positions [b * prompts_per_block, (b + 1) * prompts_per_block)); a group's `group_id` is
its prompt's position. Each batch the orchestrator makes appends one JSON line to `{run_dir}/prompts.jsonl`
before the batch is sent:

    {"step", "generation", "iteration", "reward", "trained": [positions],
     "dropped": {rule: [positions]}}

`trained` are the groups the step's batch holds; `dropped` names the rule that left each other prompt of
its generation out (in the first step of a generation only, except `off_policy`):
- `filtered`: its group failed `data.buffer` keep (online_difficulty_filtering, dynamic_sampling);
- `judge_failed`: its judge failed under `on_failure: drop_group` (grpokit.judges);
- `surplus`: kept, but past the groups a generation needs (oversampling, a resampling round's extra);
- `too_long`: its prompt is longer than the prompt limit, never sampled;
- `bad_image`: an image of its prompt is missing, unreadable or over the pixel budget, never sampled
  (grpokit.orchestrator.image_prompts);
- `unused_round`: in a resampling round the generation did not need (whole-batch generation);
- `off_policy`: older than data.max_off_policy_steps when its step's batch was formed.
A run that reaches trainer.max_steps appends a closing line `{"step": null, "unfinished": [positions]}`:
the prompts a stream had drawn and not handed out (data.streaming samples ahead).

A resumed or restarted orchestrator makes the batches of its steps again and appends their lines, so the
last line of a step is the batch that step trained on (a batch is trained whole, and made again only
when no copy of it was kept). `audit` checks that the last lines account for every position from 0 up
exactly once; a streamed run's resume (grpokit.orchestrator.driver) reads `accounted_before` to
continue at the first prompt no earlier step accounted for. Iterations after the first
(num_iterations > 1) train their generation's groups again on purpose and are not counted twice.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from grpokit.judges import dropped_by_judge

RECORD = "prompts.jsonl"
RULES = ("filtered", "judge_failed", "surplus", "too_long", "bad_image", "unused_round", "off_policy")


def append_record(run_dir: Path, record: dict) -> None:
    """Append one line in a single write: a kill leaves at most a partial last line, which `repair` cuts."""
    with open(Path(run_dir) / RECORD, "a") as f:
        f.write(json.dumps(record, separators=(",", ":")) + "\n")


def repair(run_dir: Path) -> None:
    """Cut a partial last line (a process killed while writing it), so the next line starts clean."""
    path = Path(run_dir) / RECORD
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with open(path, "r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)
            f.flush()
            os.fsync(f.fileno())


def read_records(run_dir: Path) -> tuple[dict[int, dict], dict | None]:
    """(the last complete line of each step, the last closing line or None); unparsable lines are skipped."""
    steps, closing = {}, None
    path = Path(run_dir) / RECORD
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record.get("step") is None:
            closing = record
        else:
            steps[int(record["step"])] = record
    return steps, closing


def positions_of(record: dict) -> list[int]:
    """Every position a step's line accounts for: trained, then dropped by each rule (repeated iterations: none)."""
    if record.get("iteration", 0):
        return []
    return list(record["trained"]) + [p for rule in record.get("dropped", {}).values() for p in rule]


def accounted_before(run_dir: Path, step: int) -> set[int]:
    """Positions that the last lines of steps < `step` account for (what a resume must not draw again)."""
    steps, _ = read_records(run_dir)
    return {p for s, record in steps.items() if s < step for p in positions_of(record)}


def audit(run_dir: Path, steps: int) -> dict[str, int]:
    """Check that steps 0..steps-1 account for every position of the data order from 0 up exactly once:
    trained once, or dropped by a named rule, or (with a closing line) unfinished at the end. Returns the
    counts (trained, each rule, unfinished); raises AssertionError naming the first position that fails."""
    records, closing = read_records(run_dir)
    missing_steps = sorted(set(range(steps)) - set(records))
    assert not missing_steps, f"{RECORD} has no line for steps {missing_steps[:10]}"
    seen: dict[int, str] = {}
    counts = {"trained": 0, **dict.fromkeys(RULES, 0), "unfinished": 0}
    first = [s for s in range(steps) if not records[s].get("iteration", 0)]  # repeated iterations: not again
    sources = [(s, "trained", records[s]["trained"]) for s in first]
    sources += [(s, rule, ps) for s in first for rule, ps in records[s].get("dropped", {}).items()]
    sources += [("end", "unfinished", closing["unfinished"])] if closing else []
    for where, what, positions in sources:
        for p in positions:
            assert p not in seen, f"prompt {p} of the data order is {seen[p]} and again {what} at step {where}"
            seen[p] = f"{what} at step {where}"
            counts[what] += 1
    holes = sorted(set(range(max(seen, default=-1) + 1)) - set(seen))
    assert not holes, f"prompts {holes[:10]} of the data order were never trained nor dropped by a rule"
    return counts


def step_record(step: int, gen, iteration: int, groups: list, chunk_groups: list, keep, fresh: bool) -> dict:
    """The line of a step's batch: `groups` trained (of its chunk `chunk_groups`, the rest off-policy);
    in the first step of generation `gen` (`fresh`) also what the generation dropped, by rule (`keep`:
    data.buffer.keep, which tells a filtered group from a surplus one)."""
    trained = [g[0].group_id for g in groups]
    dropped: dict[str, list[int]] = {}
    if off_policy := sorted({g[0].group_id for g in chunk_groups} - set(trained)):
        dropped["off_policy"] = off_policy
    if fresh:
        kept = {g[0].group_id for g in gen.kept}
        for g in gen.generated:
            if g[0].group_id not in kept:
                rule = "surplus" if keep([r.reward for r in g]) else "filtered"
                rule = "judge_failed" if dropped_by_judge(g) else rule
                dropped.setdefault(rule, []).append(g[0].group_id)
        dropped.update(gen.skipped)
    return {"step": step, "generation": gen.index, "iteration": iteration, "trained": trained, "dropped": dropped}
