"""Draw a run's timeline.jsonl: when the orchestrator (engine) and the trainer worked on each step.

python scripts/plot_timeline.py outputs/run_X docs/img/timeline.png [FIRST_STEPS]
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpokit.common.timeline import read_timeline


def main(run_dir: str, out: str, first_steps: str = "0") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = [e for e in read_timeline(run_dir) if not int(first_steps) or e["step"] < int(first_steps)]
    if not events:
        raise SystemExit(f"no timeline.jsonl in {run_dir}")
    t0 = min(e["start"] for e in events)
    rows = {"orchestrator": 1, "trainer": 0}
    colors = {"orchestrator": "tab:blue", "trainer": "tab:orange"}
    fig, ax = plt.subplots(figsize=(10, 2.6))
    for e in events:
        y = rows[e["role"]]
        ax.barh(y, e["end"] - e["start"], left=e["start"] - t0, color=colors[e["role"]], edgecolor="white", height=0.6)
        label = f"{e['step']}" if e["role"] == "trainer" else f"{e['step']}\n(w{e.get('policy_step', '?')})"
        ax.text((e["start"] + e["end"]) / 2 - t0, y, label, ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks([0, 1], ["trainer: step n", "engine: batch n\n(weights w)"])
    ax.set_xlabel("seconds since start")
    ax.set_title(f"{Path(run_dir).name}: generation of batch n+1 overlaps training of step n")
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main(*sys.argv[1:4])
