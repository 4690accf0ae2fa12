"""docs/custom-components.md works as written: a loss in the user's own file, by class path, then by
short name through an entry point, trained end to end on the tiny model."""

import importlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

from grpokit.cli.discovery import components, discover
from grpokit.main import main
from grpokit.testing import tiny_fit_argv
from tests.support import read_metrics

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "custom-components.md").read_text()


def tiny_fit(tmp_path, tiny_model, name, loss):
    argv = tiny_fit_argv(
        tmp_path, tiny_model, name, "--model.loss", loss, "--trainer.max_steps", "2", "--ckpt.interval", "0"
    )
    assert main(argv) == 0
    return read_metrics(tmp_path / name)


def test_doc_example_by_class_path_then_entry_point(tmp_path, tiny_model, monkeypatch):
    code = re.search(r"```python\n# my_lab/losses.py\n(.*?)```", DOC, re.S).group(1)
    site = tmp_path / "site"
    (site / "my_lab").mkdir(parents=True)
    (site / "my_lab" / "__init__.py").write_text("")
    (site / "my_lab" / "losses.py").write_text(code)
    monkeypatch.syspath_prepend(str(site))

    rows = tiny_fit(tmp_path, tiny_model, "by-path", "my_lab.losses.Reinforce")
    assert len(rows) == 2 and "my_lab.losses.Reinforce" in (tmp_path / "by-path" / "config.yaml").read_text()

    project = tmp_path / "my-lab"  # the doc's layout and pyproject.toml, installed by pip for real
    (project / "my_lab").mkdir(parents=True)
    (project / "my_lab" / "__init__.py").write_text("")
    (project / "my_lab" / "losses.py").write_text(code)
    (project / "pyproject.toml").write_text(
        re.search(r"```toml\n# my-lab/pyproject.toml\n(.*?)```", DOC, re.S).group(1)
    )
    installed = tmp_path / "installed"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(installed),
            str(project),
        ],
        check=True,
    )
    monkeypatch.syspath_prepend(str(installed))
    shutil.rmtree(site)  # from here on, my_lab comes from the installed distribution
    for module in [m for m in sys.modules if m == "my_lab" or m.startswith("my_lab.")]:
        del sys.modules[module]
    importlib.invalidate_caches()
    discover()
    assert any(c.name == "Reinforce" and c.class_path == "my_lab.losses.Reinforce" for c in components("loss"))
    rows = tiny_fit(tmp_path, tiny_model, "by-name", "Reinforce")
    assert len(rows) == 2
