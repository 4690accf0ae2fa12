"""Sweep runner and launchers without training: early recipe errors, a folder of another sweep, run commands."""

import subprocess
import sys
import time
from importlib.util import find_spec
from pathlib import Path

import pytest
import yaml

from grpokit.sweep.launchers import LocalLauncher, RunCommand, make_launcher
from grpokit.sweep.runner import SweepRunner
from grpokit.sweep.spec import SweepError, load_sweep

RECIPE = str(Path(__file__).resolve().parents[2] / "recipes" / "reverse_text.yaml")


def runner(tmp_path, content: dict, recipe_argv=("--config", RECIPE), name="s") -> SweepRunner:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(content))
    return SweepRunner(load_sweep(path), list(recipe_argv), tmp_path / name, LocalLauncher(), 1)


def test_a_misspelt_recipe_key_fails_before_any_run_starts(tmp_path):
    sweep = runner(tmp_path, {"axes": {"model.lr": [1.0e-4], "model.lrr": [2]}})
    with pytest.raises(SweepError, match=r"(?s)run 00-lr=0.0001-lrr=2: the recipe does not parse.*lrr"):
        sweep.prepare()
    assert not list(sweep.sweep_dir.glob("*/log.txt"))


def test_a_misspelt_component_on_an_axis_names_the_key_and_the_known_names(tmp_path):
    sweep = runner(tmp_path, {"axes": {"model.loss": ["AIPO", "GSPOO"]}})
    with pytest.raises(
        SweepError, match=r"run 01-loss=GSPOO: model.loss: no loss is named 'GSPOO' .*did you mean GSPO\?"
    ):
        sweep.prepare()
    assert not list(sweep.sweep_dir.glob("*/log.txt"))


def test_each_run_gets_its_overlay_and_resolved_config_and_the_fit_command(tmp_path):
    sweep = runner(tmp_path, {"axes": {"model.lr": [1.0e-4, 3.0e-4]}})
    sweep.prepare()
    run = sweep.spec.runs[1]
    overlay = yaml.safe_load((sweep.run_dir(run) / "overrides.yaml").read_text())
    assert overlay == {"model": {"lr": 3.0e-4}, "output_dir": str(sweep.sweep_dir), "run_name": run.id}
    resolved = yaml.safe_load((sweep.run_dir(run) / "resolved.yaml").read_text())
    assert resolved["model"]["lr"] == 3.0e-4 and resolved["run_name"] == run.id and resolved["data"]["batch_size"] == 32
    command, resumed_from = sweep.command(run)
    assert (
        command[-4:] == ["grpokit", "fit", "--config", str(sweep.run_dir(run) / "resolved.yaml")]
        and resumed_from is None
    )
    (sweep.run_dir(run) / "checkpoints").mkdir()
    (sweep.run_dir(run) / "checkpoints" / "step_4.ckpt").write_bytes(b"")
    assert sweep.command(run) == ([*command, "--ckpt.resume_step", "-1"], 4)


def test_a_folder_holding_another_sweep_is_refused(tmp_path):
    runner(tmp_path, {"axes": {"model.lr": [1.0e-4]}}).prepare()
    with pytest.raises(
        SweepError, match=r"holds a different sweep \(runs were \['00-lr=0.0001'\], now \['00-lr=0.0002'\]\)"
    ):
        runner(tmp_path, {"axes": {"model.lr": [2.0e-4]}}).prepare()


def test_local_launcher_appends_output_and_reports_the_exit_code(tmp_path):
    launcher, log = LocalLauncher(), tmp_path / "log.txt"
    handles = [
        launcher.start([sys.executable, "-c", f"print('attempt {i}'); raise SystemExit({i})"], log) for i in (0, 3)
    ]
    while any(launcher.poll(h) is None for h in handles):
        time.sleep(0.05)
    assert [launcher.poll(h) for h in handles] == [0, 3] and launcher.job_id(handles[0]) == str(handles[0].pid)
    text = log.read_text()
    assert "attempt 0" in text and "attempt 3" in text and text.count("# ") == 2


def test_a_submitit_job_body_runs_the_command_into_the_log(tmp_path):
    job = RunCommand([sys.executable, "-c", "print('trained')"], str(tmp_path / "log.txt"), str(tmp_path))
    assert job() == 0 and "trained" in (tmp_path / "log.txt").read_text()
    with pytest.raises(subprocess.CalledProcessError):
        RunCommand([sys.executable, "-c", "raise SystemExit(2)"], str(tmp_path / "log.txt"), str(tmp_path))()


def test_launcher_names_are_checked(tmp_path):
    with pytest.raises(SweepError, match="not a launcher; use local or submitit"):
        make_launcher({"name": "wandb"}, tmp_path, "s")
    with pytest.raises(SweepError, match="local takes no settings"):
        make_launcher({"name": "local", "timeout_min": 3}, tmp_path, "s")


@pytest.mark.skipif(find_spec("submitit") is not None, reason="submitit is installed")
def test_submitit_launcher_without_submitit_names_the_fix(tmp_path):
    with pytest.raises(SweepError, match=r"pip install submitit"):
        make_launcher({"name": "submitit", "timeout_min": 10}, tmp_path, "s")


@pytest.mark.skipif(find_spec("submitit") is None, reason="needs submitit (not a grpokit dependency)")
def test_submitit_launcher_runs_a_job_with_the_local_executor(tmp_path):
    launcher = make_launcher({"name": "submitit", "cluster": "local", "timeout_min": 5}, tmp_path, "s")
    job = launcher.start([sys.executable, "-c", "print('on the cluster')"], tmp_path / "log.txt")
    deadline = time.monotonic() + 120
    while launcher.poll(job) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert launcher.poll(job) == 0 and launcher.job_id(job)
    assert "on the cluster" in (tmp_path / "log.txt").read_text()
