"""`grpokit report SWEEP_DIR`: report.md and plots/*.png of a sweep folder.

The report has: the runs and their state; a plot per metric (a line per variant, mean over seeds, band
min..max); a table of final metrics (mean of each run's last k logged steps, 95% bootstrap CI, see
report_stats.py); and the keys whose resolved values differ between variants, read from each run's
resolved.yaml, so the reader sees exactly what changed and nothing else.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from grpokit.common.io import atomic_write_text
from grpokit.sweep.report_plots import plot_metric
from grpokit.sweep.report_stats import RunMetrics, final_value, identical_replicates, read_metrics, variant_label
from grpokit.sweep.spec import SweepError, is_seed_key
from grpokit.sweep.state import asked_steps, describe_run, run_outcome, trained_steps

DEFAULT_METRICS = (
    "reward",
    "eval/reward",
    "kl",
    "masked_frac",
    "clipped_frac",
    "entropy",
    "approx_entropy",
    "loss",
    "grad_norm",
    "seq_len",
)
NOT_COMPARED = {"output_dir", "run_name"}  # differ between every two runs by construction


def write_report(sweep_dir: Path, metrics: list[str] | None = None, last_k: int = 5) -> Path:
    """Write sweep_dir/report.md and sweep_dir/plots/; returns the report's path."""
    runs, states = load_sweep_dir(sweep_dir)
    done = [r for r in runs if finished(sweep_dir, r["id"], states[r["id"]])]
    if not done:
        raise SweepError(
            f"{sweep_dir}: no finished run to report on yet (states: {sorted({s['state'] for s in states.values()})})"
        )
    variants: dict[str, list[RunMetrics]] = {}
    for run in done:
        variants.setdefault(variant_label(run), []).append(
            read_metrics(run["id"], sweep_dir / run["id"] / "metrics.csv")
        )
    chosen = pick_metrics(metrics, [m for v in variants.values() for m in v])
    plots = [plot_metric(metric, variants, sweep_dir / "plots") for metric in chosen]
    lines = [f"# Sweep report: {sweep_dir.name}", "", *summary(sweep_dir, runs, states)]
    lines += [*left_out(sweep_dir, [r for r in runs if r not in done], states), "", "## Curves", ""]
    lines += [f"![{metric}](plots/{path.name})" for metric, path in zip(chosen, plots)]
    lines += ["", *final_table(variants, chosen, last_k), "", *config_diff(sweep_dir, done)]
    path = sweep_dir / "report.md"
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path


def load_sweep_dir(sweep_dir: Path) -> tuple[list[dict], dict[str, dict]]:
    path = sweep_dir / "sweep.json"
    if not path.is_file():
        raise FileNotFoundError(f"{sweep_dir}: no sweep.json; pass a folder written by `grpokit sweep`")
    saved = json.loads(path.read_text())
    return saved["definition"]["runs"], saved["runs"]


def finished(sweep_dir: Path, run_id: str, state: dict) -> bool:
    """Whether a run is done: marked so, and its metrics.csv holds every step asked (a sweep.json of a
    grpokit that took a SIGTERM'd run's exit 0 for done may mark a cut-short run done)."""
    run_dir = sweep_dir / run_id
    return state["state"] == "done" and run_outcome(0, trained_steps(run_dir), asked_steps(run_dir)) == "done"


def left_out(sweep_dir: Path, runs: list[dict], states: dict[str, dict]) -> list[str]:
    """The report's line naming the runs not done, which its curves and tables leave out, and why."""
    if not runs:
        return []
    named = ", ".join(f"{r['id']} ({describe_run(states[r['id']], sweep_dir / r['id'])})" for r in runs)
    return [
        "",
        f"**Left out of the curves and tables, not finished**: {named}. "
        "Run the same `grpokit sweep` command again to finish them, then the report again.",
    ]


def pick_metrics(requested: list[str] | None, runs: list[RunMetrics]) -> list[str]:
    """The requested metric columns (all must exist), or the default ones that some run logged."""
    available = sorted({m for r in runs for m in r.series})
    if requested is None:
        return [m for m in DEFAULT_METRICS if m in available]
    missing = [m for m in requested if m not in available]
    if missing:
        raise SweepError(f"--metrics {missing}: no run logged them; metrics.csv columns are {available}")
    return list(requested)


def summary(sweep_dir: Path, runs: list[dict], states: dict[str, dict]) -> list[str]:
    definition = json.loads((sweep_dir / "sweep.json").read_text())["definition"]
    lines = [f"Recipe arguments: `{' '.join(definition['recipe_argv'])}`"]
    if definition.get("rollouts"):
        lines.append(
            f"\nEvery run trained on the recorded rollouts `{definition['rollouts']}` "
            "(identical batches; reward and the other orchestrator metrics are the recording's)."
        )
    lines += ["", "| run | variant | state | steps | attempts | resumed from step |", "|---|---|---|---|---|---|"]
    for run in runs:
        s, run_dir = states[run["id"]], sweep_dir / run["id"]
        resumed = "" if s.get("resumed_from") is None else str(s["resumed_from"])
        state = s["state"] if finished(sweep_dir, run["id"], s) or s["state"] != "done" else "incomplete"
        steps = f"{trained_steps(run_dir)} of {asked_steps(run_dir) or '?'}"
        lines.append(f"| {run['id']} | {variant_label(run)} | {state} | {steps} | {s['attempts']} | {resumed} |")
    return lines


def final_table(variants: dict[str, list[RunMetrics]], metrics: list[str], last_k: int) -> list[str]:
    lines = [
        "## Final metrics",
        "",
        f"Mean over seeds of each run's last {last_k} logged steps, "
        "with a 95% bootstrap CI (seeds, then steps, resampled).",
        "",
    ]
    same = {label: pairs for label, runs in variants.items() if (pairs := identical_replicates(runs))}
    for label, pairs in same.items():
        lines += [
            f"**Warning: the seeds of {label} are not replicates**: "
            + ", ".join(f"{a} and {b}" for a, b in pairs)
            + " sampled the same rollouts (equal reward and seq_len at every step), so no CI is shown for it. "
            "A seed axis must vary seed_everything with data.seed and data.sampling.seed left null (docs/sweeps.md).",
            "",
        ]
    lines += ["| variant | seeds | " + " | ".join(metrics) + " |", "|---|---|" + "---|" * len(metrics)]
    for label, runs in variants.items():
        cells = []
        for metric in metrics:
            value = final_value(runs, metric, last_k)
            ci = "[identical replicates]" if label in same else f"[{value[1]:.4g}, {value[2]:.4g}]" if value else ""
            cells.append("" if value is None else f"{value[0]:.4g} {ci}")
        lines.append(f"| {label} | {len(runs)} | " + " | ".join(cells) + " |")
    return lines


def config_diff(sweep_dir: Path, runs: list[dict]) -> list[str]:
    """A table of the resolved-config keys whose values differ between variants (seeds listed apart)."""
    configs = {
        r["id"]: flatten(yaml.safe_load((sweep_dir / r["id"] / "resolved.yaml").read_text()) or {}) for r in runs
    }
    keys = sorted({k for c in configs.values() for k in c} - NOT_COMPARED)
    differing = [k for k in keys if len({shown(c, k) for c in configs.values()}) > 1]
    seed_keys, other_keys = [k for k in differing if is_seed_key(k)], [k for k in differing if not is_seed_key(k)]
    by_variant: dict[str, list[str]] = {}
    for r in runs:
        by_variant.setdefault(variant_label(r), []).append(r["id"])
    lines = [
        "## What differs between variants",
        "",
        "Keys of the resolved configs (each run's resolved.yaml) whose "
        "values differ; every other key is the same in every run.",
        "",
    ]
    if seed_keys:
        lines.append(f"Seeds ({', '.join(seed_keys)}) differ between the runs of a variant.\n")
    if not other_keys:
        return lines + ["No key differs between variants."]
    lines += ["| key | " + " | ".join(by_variant) + " |", "|---|" + "---|" * len(by_variant)]
    for key in other_keys:
        cells = []
        for ids in by_variant.values():
            values = {shown(configs[i], key) for i in ids}
            cells.append(values.pop() if len(values) == 1 else "varies")
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return lines


def shown(config: dict[str, Any], key: str) -> str:
    """A resolved value as a table cell; a dash where the key does not exist (another class's init_arg)."""
    return f"`{json.dumps(config[key], sort_keys=True)}`" if key in config else "-"


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """{"model": {"lr": 1}} -> {"model.lr": 1}; lists and scalars are leaves."""
    if not isinstance(config, dict) or not config:
        return {prefix: config} if prefix else {}
    out: dict[str, Any] = {}
    for key, value in config.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out
