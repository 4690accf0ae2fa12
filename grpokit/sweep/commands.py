"""Argument parsing of `grpokit sweep`, `grpokit report` and `grpokit rollouts` (grpokit/main.py dispatches here)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from grpokit.cli.recipe_files import find_recipe
from grpokit.sweep.launchers import make_launcher
from grpokit.sweep.recording import record, replay
from grpokit.sweep.runner import SweepRunner
from grpokit.sweep.spec import SweepError, load_sweep


def sweep_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="grpokit sweep",
        allow_abbrev=False,
        description="Run every variant of a recipe that a sweep file lists; run it again "
        "to resume. Other arguments (e.g. --trainer.max_steps 10) go to every run.",
    )
    parser.add_argument(
        "--config", action="append", required=True, help="the recipe (repeat for overlays), as for grpokit fit"
    )
    parser.add_argument(
        "--sweep",
        required=True,
        help="the sweep file (axes: and/or runs:), or a shipped one by name; see docs/sweeps.md",
    )
    parser.add_argument(
        "--max_parallel", type=int, default=None, help="runs at the same time (overrides the sweep file)"
    )
    parser.add_argument(
        "--sweep_dir", default=None, help="the sweep folder (default: {output_dir}/{name} of the sweep file)"
    )
    args, recipe_extra = parser.parse_known_args(argv)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        spec = load_sweep(find_recipe(args.sweep, "--sweep"))  # or a shipped one by name: sweeps/reverse_text_losses
        max_parallel = args.max_parallel or spec.max_parallel
        if max_parallel < 1:
            raise SweepError(f"--max_parallel must be >= 1, got {max_parallel}")
        sweep_dir = Path(args.sweep_dir or Path(spec.output_dir) / spec.name)
        recipe_argv = [arg for path in args.config for arg in ("--config", str(Path(path).resolve()))] + recipe_extra
        runner = SweepRunner(
            spec, recipe_argv, sweep_dir, make_launcher(spec.launcher, sweep_dir, spec.name), max_parallel
        )
        code = runner.run()
    except (SweepError, FileNotFoundError) as e:
        parser.exit(2, f"grpokit sweep: error: {e}\n")
    print(f"sweep folder: {runner.sweep_dir}\nreport: grpokit report {runner.sweep_dir}")
    return code


def report_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="grpokit report",
        description="report.md and PNG plots of a sweep folder: curves per "
        "variant over seeds, final metrics with bootstrap CIs, config diff.",
    )
    parser.add_argument("sweep_dir", help="a folder written by grpokit sweep")
    parser.add_argument(
        "--metrics",
        nargs="+",
        default=None,
        help="metric columns to plot and tabulate (default: reward, "
        "eval/reward, kl, masked_frac, entropy, ... whichever exist)",
    )
    parser.add_argument("--last_k", type=int, default=5, help="final metric = mean over each run's last k logged steps")
    args = parser.parse_args(argv)
    from grpokit.sweep.report import write_report

    try:
        path = write_report(Path(args.sweep_dir), args.metrics, args.last_k)
    except (SweepError, FileNotFoundError) as e:
        parser.exit(2, f"grpokit report: error: {e}\n")
    print(path)
    return 0


def rollouts_main(argv: list[str]) -> int:
    usage = "grpokit rollouts {record,replay} DIR --config RECIPE [recipe arguments]"
    if len(argv) < 2 or argv[0] not in ("record", "replay") or argv[1].startswith("-"):
        raise SystemExit(
            f"usage: {usage}\n  record: run the recipe (a grpokit fit) and keep its training "
            "batches in DIR\n  replay: train on the batches in DIR (needs --run_name), no sampling"
        )

    command, folder, recipe_argv = argv[0], Path(argv[1]), argv[2:]
    if command == "record":
        print(record(folder, recipe_argv))
    else:
        replay(folder, recipe_argv)
    return 0
