"""A 2 losses x 2 seeds sweep on the tiny model, SIGKILLed after its first run, resumed, then reported."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from grpokit.main import main
from tests.support import read_metrics

REPO = Path(__file__).resolve().parents[2]
STEPS = 2


def alive(pid: int) -> bool:
    """Whether a process runs (a zombie left to a container's init that does not reap counts as dead)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def states(sweep_dir: Path) -> dict:
    path = sweep_dir / "sweep.json"
    return json.loads(path.read_text())["runs"] if path.exists() else {}


def test_sweep_killed_after_its_first_run_resumes_and_reports(tmp_path, tiny_overlay):
    sweep = tmp_path / "losses.yaml"
    sweep.write_text(yaml.safe_dump({"axes": {"model.loss": ["AIPO", "ClippedPG"], "seed_everything": [0, 1]}}))
    sweep_dir = tmp_path / "sweep"
    args = [
        "sweep",
        "--config",
        str(REPO / "recipes" / "reverse_text.yaml"),
        "--config",
        str(tiny_overlay(steps=STEPS, ckpt_interval=1)),
        "--sweep",
        str(sweep),
        "--sweep_dir",
        str(sweep_dir),
    ]
    first, second = "00-loss=AIPO-seed_everything=0", "01-loss=AIPO-seed_everything=1"

    proc = subprocess.Popen(
        [sys.executable, "-m", "grpokit", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 300
    while not (
        states(sweep_dir).get(first, {}).get("state") == "done"
        and (sweep_dir / second / "checkpoints" / "step_1.ckpt").exists()
    ):
        assert proc.poll() is None, "the sweep ended before it could be killed"
        assert time.monotonic() < deadline, "no second-run checkpoint after 300 s"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed = states(sweep_dir)
    assert [killed[k]["state"] for k in sorted(killed)] == ["done", "running", "pending", "pending"]
    orphan = int(killed[second]["job_id"])
    for _ in range(100):  # the run dies with the sweep (PR_SET_PDEATHSIG), so the resumed sweep never races it
        if not alive(orphan):
            break
        time.sleep(0.1)
    assert not alive(orphan)

    assert main([*args, "--max_parallel", "2"]) == 0
    resumed = states(sweep_dir)
    assert {k: v["state"] for k, v in resumed.items()} == dict.fromkeys(killed, "done")
    assert resumed[first]["attempts"] == 1  # finished runs are skipped
    assert resumed[second]["attempts"] == 2 and resumed[second]["resumed_from"] >= 1  # from its checkpoint
    for run_id in resumed:
        rows = read_metrics(sweep_dir / run_id)
        assert [int(r["step"]) for r in rows] == list(range(STEPS)), run_id  # every step trained exactly once
        resolved = yaml.safe_load((sweep_dir / run_id / "resolved.yaml").read_text())
        assert resolved["model"]["loss"]["class_path"].endswith("AIPO" if "AIPO" in run_id else "ClippedPG")
        assert resolved["seed_everything"] == int(run_id[-1])

    assert main(["report", str(sweep_dir), "--last_k", "2"]) == 0
    report = (sweep_dir / "report.md").read_text()
    for metric in ("reward", "kl", "masked_frac", "approx_entropy"):
        assert (sweep_dir / "plots" / f"{metric}.png").stat().st_size > 1000
        assert f"![{metric}](plots/{metric}.png)" in report
    assert "| model.loss=AIPO | 2 |" in report and "| model.loss=ClippedPG | 2 |" in report  # two seeds per variant
    assert (
        '| model.loss.class_path | `"grpokit.registry.losses.aipo.AIPO"` '
        '| `"grpokit.registry.losses.clipped_pg.ClippedPG"` |' in report
    )
    assert "Seeds (data.seed, seed_everything) differ" in report  # data.seed follows seed_everything
