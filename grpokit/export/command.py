"""Argument parsing for `grpokit export RUN_DIR [--step N] --out DIR [--merge] [--force] [--dtype D]`."""

from __future__ import annotations

import argparse

from grpokit.export.folder import export_run


def parse_args(argv: list[str]) -> argparse.Namespace:
    import grpokit.export

    p = argparse.ArgumentParser(
        prog="grpokit export",
        description=grpokit.export.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run folder (output_dir/run_name, e.g. outputs/run_<time>)")
    p.add_argument("--out", required=True, metavar="DIR", help="the export folder (new or empty, unless --force)")
    p.add_argument("--step", type=int, default=None, help="the step to export (default: the newest the run holds)")
    p.add_argument("--merge", action="store_true", help="merge a LoRA adapter into its base: a full model folder")
    p.add_argument("--force", action="store_true", help="replace the contents of a non-empty --out folder")
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        default=None,
        help="dtype of a full model folder (--merge, or a full fine-tuning run); default the run's model.dtype",
    )
    return p.parse_args(argv)


def export_main(argv: list[str]) -> int:
    """`grpokit export`: write one step of a run as a peft adapter or full Hugging Face model folder."""
    args = parse_args(argv)
    out = export_run(args.run_dir, args.out, step=args.step, merge=args.merge, force=args.force, dtype=args.dtype)
    print(out)
    return 0
