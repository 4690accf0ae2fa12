"""Draw a run's timeline.jsonl: when the orchestrator (engine) and the trainer worked on each step, and,
for a streamed run (data.streaming), each group's span in the engine and the weight updates it loaded.

python scripts/plot_timeline.py outputs/run_X docs/img/timeline.png [FIRST_STEPS]

Group spans are stacked in lanes (a group takes the lowest lane free when it was submitted), orange
when the group's tokens came from more than one weight step (it decoded across an update); each
`weights` mark is a dashed line labelled with the step loaded.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpokit.common.timeline import read_timeline


def lanes(spans: list[dict]) -> list[int]:
    """A lane per span (in start order): the lowest one whose last span ended before this one started."""
    ends: list[float] = []
    out = []
    for e in spans:
        lane = next((i for i, end in enumerate(ends) if end <= e["start"]), len(ends))
        if lane == len(ends):
            ends.append(0.0)
        ends[lane] = e["end"]
        out.append(lane)
    return out


def main(run_dir: str, out: str, first_steps: str = "0") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = [e for e in read_timeline(run_dir) if not int(first_steps) or e["step"] < int(first_steps)]
    if not events:
        raise SystemExit(f"no timeline.jsonl in {run_dir}")
    t0 = min(e["start"] for e in events)
    groups = sorted((e for e in events if e["role"] == "group"), key=lambda e: e["start"])
    updates = [e for e in events if e["role"] == "weights"]
    group_lanes = lanes(groups)
    num_lanes = max(group_lanes, default=-1) + 1
    rows = {"orchestrator": 1, "trainer": 0}
    colors = {"orchestrator": "tab:blue", "trainer": "tab:orange"}
    fig, ax = plt.subplots(figsize=(10, 2.6 + 0.25 * num_lanes))
    for e in events:
        if e["role"] not in rows:
            continue
        y = rows[e["role"]]
        ax.barh(y, e["end"] - e["start"], left=e["start"] - t0, color=colors[e["role"]], edgecolor="white", height=0.6)
        label = f"{e['step']}" if e["role"] == "trainer" else f"{e['step']}\n(w{e.get('policy_step', '?')})"
        ax.text((e["start"] + e["end"]) / 2 - t0, y, label, ha="center", va="center", fontsize=7, color="white")
    for e, lane in zip(groups, group_lanes):
        mixed = e.get("first_weights") != e.get("last_weights")
        color = "tab:red" if mixed else "tab:green"
        ax.barh(2 + 0.3 * lane, e["end"] - e["start"], left=e["start"] - t0, color=color, height=0.25)
    for e in updates:
        ax.axvline(e["start"] - t0, color="grey", linestyle="--", linewidth=0.8)
        ax.text(e["start"] - t0, 1.6, f"w{e['step']}", fontsize=6, color="grey", ha="left")
    ticks = [0, 1] + ([2 + 0.15 * (num_lanes - 1)] if num_lanes else [])
    names = ["trainer: step n", "engine: batch n\n(weights w)"] + (
        ["groups in flight\n(red: mixed weights)"] if num_lanes else []
    )
    ax.set_yticks(ticks, names)
    ax.set_xlabel("seconds since start")
    title = (
        "groups stream through the engine across weight updates"
        if groups
        else "generation of batch n+1 overlaps training of step n"
    )
    ax.set_title(f"{Path(run_dir).name}: {title}")
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main(*sys.argv[1:4])
