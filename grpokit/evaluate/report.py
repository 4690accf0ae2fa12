"""`grpokit eval`'s outputs: one JSON with every problem's sample rewards and each model's per-environment
metrics with bootstrap intervals, a paired comparison when two models ran on the same problems, and a
short markdown report of the same numbers. Both are written atomically (grpokit.common.io).

JSON layout:
    settings: k, temperature, threshold, split, problems, seed, pass_at, resamples, level, ...
    models: {label: {weights: "base" or "RUN_DIR step N", metrics: {env: {problems, metrics: {name:
             {mean, ci_low, ci_high}}}}, problems: [{env, example, rewards, answers, greedy_reward, metrics}]}}
    comparison: {a, b, envs: {env: {metric: {diff (b - a), ci_low, ci_high}}}}   (two models only)
    notes: what was left out and why (maj@n for environments without parsed answers)
"""

from __future__ import annotations

from pathlib import Path

from grpokit.common.io import atomic_create_json, atomic_write_json, atomic_write_text
from grpokit.evaluate.scoring import Problem
from grpokit.orchestrator.eval_metrics import paired_difference


def compare(values_a: dict, values_b: dict, seed: int, resamples: int, level: float) -> dict:
    """{env: {metric: paired difference b - a}} over the metrics both models have for an env."""
    out = {}
    for env, metrics_a in values_a.items():
        metrics_b = values_b.get(env, {})
        out[env] = {
            name: paired_difference(vs, metrics_b[name], seed, resamples, level)
            for name, vs in metrics_a.items()
            if name in metrics_b and len(metrics_b[name]) == len(vs)
        }
    return out


def notes(summaries: dict[str, dict], n: int) -> list[str]:
    """Why a metric is missing: maj@n for environments whose tasks parse no answer."""
    envs = {env for summary in summaries.values() for env, s in summary.items() if f"maj@{n}" not in s["metrics"]}
    return [
        f"{env}: no maj@{n}: its tasks have no parse_answer(reply) method, so answers cannot be compared"
        for env in sorted(envs)
    ]


def result(settings: dict, models: dict[str, dict], problems: dict[str, list[Problem]], comparison: dict | None):
    """The JSON document (see the module docstring)."""
    n = settings["k"]
    doc = {
        "settings": settings,
        "models": {
            label: {**info, "problems": [p.as_json() for p in problems[label]]} for label, info in models.items()
        },
        "notes": notes({label: info["metrics"] for label, info in models.items()}, n),
    }
    if comparison is not None:
        doc["comparison"] = comparison
    return doc


def markdown(doc: dict) -> str:
    """A short report: the settings, then one table per environment (a column per model, and the paired
    difference with its interval when there are two)."""
    s, labels = doc["settings"], list(doc["models"])
    lines = [
        "# grpokit eval",
        "",
        f"{s['problems']} problems ({s['split']} split), k = {s['k']} samples each at temperature "
        f"{s['temperature']:g}, correct = reward >= {s['threshold']:g}; {s['level']:.0%} bootstrap intervals "
        f"over problems ({s['resamples']} resamples, seed {s['seed']}).",
        "",
    ]
    lines += [f"- {label}: {doc['models'][label]['weights']}" for label in labels]
    comparison = doc.get("comparison")
    envs = sorted({env for label in labels for env in doc["models"][label]["metrics"]})
    for env in envs:
        header = ["metric", *labels] + ([f"{comparison['b']} - {comparison['a']}"] if comparison else [])
        lines += ["", f"## {env}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        names = list(dict.fromkeys(n for lb in labels for n in doc["models"][lb]["metrics"].get(env, {})["metrics"]))
        for name in names:
            row = [name] + [
                _cell(doc["models"][lb]["metrics"].get(env, {}).get("metrics", {}).get(name)) for lb in labels
            ]
            if comparison:
                d = comparison["envs"].get(env, {}).get(name)
                row.append("" if d is None else f"{d['diff']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]")
            lines.append("| " + " | ".join(row) + " |")
    lines += ["", *[f"- {note}" for note in doc["notes"]]]
    return "\n".join(lines).rstrip() + "\n"


def _cell(m: dict | None) -> str:
    return "" if m is None else f"{m['mean']:.3f} [{m['ci_low']:.3f}, {m['ci_high']:.3f}]"


def write(doc: dict, out: Path) -> tuple[Path, Path]:
    """The JSON at `out` and the markdown beside it (same name, .md); both atomic."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = out.with_suffix(".md")
    atomic_write_json(out, doc)
    atomic_write_text(report, markdown(doc))
    return out, report


def write_new(doc: dict, out: Path) -> tuple[Path, Path]:
    """As `write`, under a name no earlier eval holds: `out`, else `out`'s stem with -2, -3, ... added.

    The default name (`base_vs_step_40.json`) says which weights ran, not on what: two evals of one
    checkpoint on different eval sets (another question, more problems) must not overwrite each other.
    """
    out = Path(out)
    for n in range(1, 10_000):
        path = out if n == 1 else out.with_name(f"{out.stem}-{n}{out.suffix}")
        if atomic_create_json(path, doc):
            report = path.with_suffix(".md")
            atomic_write_text(report, markdown(doc))
            return path, report
    raise FileExistsError(f"{out}: 9,999 evals already hold this name; pass --out")
