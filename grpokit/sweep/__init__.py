"""Ablation sweeps: many `grpokit fit` runs that differ in a few recipe keys, resumable, with a report.

    grpokit sweep --config recipe.yaml --sweep sweep.yaml [--max_parallel N]   # run (or resume) a sweep
    grpokit report SWEEP_DIR                                                    # report.md + plots
    grpokit rollouts record DIR --config recipe.yaml ...                        # keep a run's batches
    grpokit rollouts replay DIR --config recipe.yaml --run_name R ...           # train on them

Modules: spec.py (the sweep file -> runs), resolve.py (a run's resolved recipe), state.py (sweep.json),
launchers.py (local processes, submitit), runner.py (launch, wait, resume), recording.py (recorded
rollouts), report.py / report_stats.py / report_plots.py (the report), commands.py (argument parsing).
See docs/sweeps.md.
"""
