"""Every package folder is listed in pyproject.toml (package-dir maps registry/, envs/, recipes/), and the
wheel built from the repository works in a fresh virtual environment, from a folder outside it."""

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import tomllib

from grpokit.testing import tiny_fit_argv

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "grpokit", "registry", "envs", "recipes")  # what the wheel is built from
# An editable install of the repository in this interpreter (pip install -e) would serve any module the
# wheel lacks from the repository: its finder comes with the system site-packages, so the venv drops it
# (sitecustomize runs after every .pth file).
HIDE_EDITABLE_INSTALL = """import sys
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
"""


def test_every_package_folder_is_installed():
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed, dirs = set(tool["packages"]), tool["package-dir"]
    found = set()
    for name, folder in dirs.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([name, *rel.parts]) if rel.parts else name)
    assert found <= listed, f"add to [tool.setuptools] packages: {sorted(found - listed)}"


def test_bare_registry_import_is_refused():
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("registry", ROOT / "registry" / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as e:
        assert "import grpokit.registry" in str(e)
    else:
        raise AssertionError("importing registry/ under its bare name must fail")
    finally:
        sys.modules.pop("registry", None)


def test_the_wheel_in_a_fresh_venv_lists_recipes_and_fits_one_by_name(tmp_path, tiny_model):
    """Built from a copy of the sources (the build writes build/ and *.egg-info beside them), installed
    with --no-deps into a venv that sees this interpreter's packages (torch and the rest are not
    reinstalled), and run from a folder outside the repository: the shipped recipes come from the wheel."""
    source, outside = tmp_path / "src", tmp_path / "elsewhere"
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copyfile(ROOT / name, source / name)
    wheel_dir, venv = tmp_path / "dist", tmp_path / "venv"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", wheel_dir, source])
    run([sys.executable, "-m", "venv", "--system-site-packages", venv])
    python, grpokit = venv / "bin" / "python", venv / "bin" / "grpokit"
    site = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip())
    (site / "sitecustomize.py").write_text(HIDE_EDITABLE_INSTALL)
    run([python, "-m", "pip", "install", "--no-deps", "--no-index", *wheel_dir.glob("grpokit-*.whl")])
    outside.mkdir()
    installed = run([python, "-c", "import grpokit; print(grpokit.__file__)"], cwd=outside).stdout
    assert installed.startswith(str(venv)), installed  # the wheel's copy, not the repository's

    listed = run([grpokit, "recipes"], cwd=outside).stdout
    assert {line.split()[0] for line in listed.splitlines()} >= {"reverse_text", "ablations/gspo", "gpu"}, listed

    argv = tiny_fit_argv(outside / "outputs", tiny_model, "r", "--trainer.max_steps", "2")
    argv[argv.index("--config") + 1] = "reverse_text"  # by name: the recipe inside the wheel
    fit = run([grpokit, *argv], cwd=outside)
    run_dir = outside / "outputs" / "r"
    assert f"grpokit: trained 2 steps: {run_dir}\n" in fit.stdout, fit.stdout[-3000:]
    assert "  evaluate    grpokit eval --config reverse_text --model.model " in fit.stdout
    assert (run_dir / "checkpoints" / "step_2.ckpt").is_file()

    # the two commands the summary printed, as printed (eval on 2 problems, 2 samples each, to stay short)
    printed = {line.split()[0]: shlex.split(line)[1:] for line in fit.stdout.splitlines() if line.startswith("  ")}
    run([grpokit, *printed["export"][1:]], cwd=outside)
    merged = run_dir / "merged"
    assert (merged / "model.safetensors").is_file() and (merged / "tokenizer.json").is_file()
    check = "from transformers import AutoModelForCausalLM as M; import sys; M.from_pretrained(sys.argv[1])"
    run([python, "-c", check, merged], cwd=outside)  # transformers alone loads it
    report = outside / "eval.json"
    run([grpokit, *printed["evaluate"][1:], "--k", "2", "--num_examples", "2", "--out", report], cwd=outside)
    assert json.loads(report.read_text())


def run(command: list, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("GRPOKIT_LOG_LEVEL", "PYTHONPATH")}
    done = subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{command[:3]} exited with {done.returncode}:\n{done.stderr[-3000:]}"
    return done
