"""PNG plots of a sweep report: one metric vs step, a line per variant (mean over seeds) and a band (min..max)."""

from __future__ import annotations

import re
from pathlib import Path

from grpokit.sweep.report_stats import RunMetrics, curve
from grpokit.sweep.spec import SweepError


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise SweepError(
            "grpokit report draws its plots with matplotlib: pip install matplotlib (or grpokit[report])"
        ) from None
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def plot_file_name(metric: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", metric) + ".png"


def plot_metric(metric: str, variants: dict[str, list[RunMetrics]], folder: Path) -> Path:
    """Draw `metric` vs step for every variant that logged it into folder/<metric>.png."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for label, runs in variants.items():
        steps, mean, low, high = curve(runs, metric)
        if not steps:
            continue
        seeds = sum(metric in r.series for r in runs)
        (line,) = ax.plot(
            steps,
            mean,
            marker="o" if len(steps) < 20 else None,
            markersize=3,
            label=f"{label} ({seeds} seed{'s' if seeds != 1 else ''})",
        )
        if seeds > 1:
            ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_xlabel("step")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel(metric)
    ax.set_title(f"{metric}: mean over seeds, band = min..max")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / plot_file_name(metric)
    fig.savefig(path)
    plt.close(fig)
    return path
