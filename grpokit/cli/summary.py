"""What `grpokit fit` (and `grpokit train`) print when training ends: the run folder, the reward at the start
and the end, the eval rewards, the newest checkpoint, and the commands that export and evaluate it. Read
from the run folder's files (metrics.csv, eval.jsonl, checkpoints/), so it shows a resumed run's whole
history, not only the steps of this process.
"""

from __future__ import annotations

import csv
import json
import shlex
from pathlib import Path

from grpokit.cli.recipe_files import CONFIG_FLAGS, recipe_flags, shipped_recipes
from grpokit.trainer.checkpoint import checkpoint_steps

WINDOW = 5  # steps averaged at each end of the reward curve
# flags of how a run trains and where it writes, left out of the eval command (which takes --ckpt RUN_DIR)
RUN_ONLY = {"trainer", "ckpt", "run_name", "output_dir", "num_threads", "seed_everything", "print_config"}


def run_summary(
    run_dir: Path,
    recipe: list[str],
    steps: int,
    max_steps: int,
    stopped_by_ctrl_c: bool = False,
    signal: str = "Ctrl-C",
) -> str:
    """The end-of-run lines for the run in `run_dir`, trained for `steps` steps of `max_steps`; `recipe`:
    the arguments that give the eval command the run's recipe (`recipe_args`). `stopped_by_ctrl_c`: a
    signal (`signal`: "Ctrl-C" or "SIGTERM") ended training early."""
    shown = shlex.quote(str(run_dir))
    if stopped_by_ctrl_c:
        head = f"grpokit: stopped by {signal} after {_count(steps)} (of {max_steps}): {run_dir}"
    else:
        head = f"grpokit: trained {_count(steps)}: {run_dir}"
    lines = [head, *reward_lines(run_dir)]
    ckpt = newest_checkpoint(run_dir)
    # export and eval also read the weights published to broadcasts/ (the newest steps)
    lines.append(f"  checkpoint  {ckpt}" if ckpt else "  checkpoint  none (ckpt.interval 0)")
    if stopped_by_ctrl_c and ckpt:
        lines.append("  resume      the same command with --ckpt.resume_step -1")
    lines.append(f"  export      grpokit export {shown} --merge --out {shlex.quote(str(run_dir / 'merged'))}")
    lines.append("  evaluate    " + shlex.join(["grpokit", "eval", *recipe, "--ckpt", str(run_dir)]))
    return "\n".join(lines) + "\n"


def reward_lines(run_dir: Path) -> list[str]:
    """The mean reward of the first and last steps, and the first and last eval reward, as found."""
    lines = []
    rewards = step_rewards(run_dir / "metrics.csv")
    if rewards:
        k = max(1, min(WINDOW, len(rewards) // 2))
        first, last = rewards[:k], rewards[-k:]
        lines.append(f"  reward      {_mean(first)} ({_steps(first)}) -> {_mean(last)} ({_steps(last)})")
    evals = eval_rewards(run_dir / "eval.jsonl")
    if evals:
        (s0, r0), (s1, r1) = evals[0], evals[-1]
        later = f" -> {r1:.3f} (step {s1})" if len(evals) > 1 else ""
        lines.append(f"  eval reward {r0:.3f} (weights of step {s0}){later}")
    return lines


def step_rewards(metrics_csv: Path) -> list[tuple[int, float]]:
    """(step, mean reward) of every trained step in metrics.csv (rows with a loss), in step order."""
    if not metrics_csv.is_file():
        return []
    with open(metrics_csv, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("loss") and r.get("reward") and r.get("step")]
    return sorted((int(float(r["step"])), float(r["reward"])) for r in rows)


def eval_rewards(eval_jsonl: Path) -> list[tuple[int, float]]:
    """(weight step, eval reward) of every evaluation in eval.jsonl, in the order they ran."""
    if not eval_jsonl.is_file():
        return []
    found = []
    for line in eval_jsonl.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a killed earlier attempt
            continue
        if isinstance(record, dict) and "eval/reward" in record:
            found.append((int(record.get("eval/weight_step", 0)), float(record["eval/reward"])))
    return found


def newest_checkpoint(run_dir: Path) -> Path | None:
    steps = checkpoint_steps(run_dir / "checkpoints")
    return run_dir / "checkpoints" / f"step_{steps[-1]}.ckpt" if steps else None


def recipe_args(argv: list[str]) -> list[str]:
    """The recipe in a fit's `argv`: its `--config` files (a shipped recipe by its name) and overrides,
    without the flags of how the run trains and where it writes (RUN_ONLY)."""
    found = []
    for name, value in recipe_flags(argv):
        if name in CONFIG_FLAGS:
            found += ["--config", recipe_name(value)]
        elif name.split(".")[0] not in RUN_ONLY:
            found += [f"--{name}", value]
    return found


def recipe_name(path: str) -> str:
    """A shipped recipe's name (it runs from anywhere), else the path as given."""
    resolved = Path(path).resolve()
    return next((name for name, p in shipped_recipes().items() if p.resolve() == resolved), path)


def _mean(steps: list[tuple[int, float]]) -> str:
    return f"{sum(r for _, r in steps) / len(steps):.3f}"


def _steps(steps: list[tuple[int, float]]) -> str:
    first, last = steps[0][0], steps[-1][0]
    return f"step {first}" if first == last else f"mean of steps {first}-{last}"


def _count(steps: int) -> str:
    return f"{steps} step" + ("" if steps == 1 else "s")
