"""A Python module written into a temporary site folder and importable for one test: the user's own
environment or reward package, as `grpokit` would find it installed."""

from __future__ import annotations

import contextlib
import importlib
import sys
import textwrap
from pathlib import Path


@contextlib.contextmanager
def installed_module(tmp_path: Path, monkeypatch, name: str, source: str):
    """Write `source` as `<tmp_path>/site/<name>.py`, put the folder first on sys.path and yield the
    imported module; the module (and any other module the test writes into the site folder) is
    forgotten afterwards, so the next test imports its own copy."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, name, raising=False)
    try:
        yield importlib.import_module(name)
    finally:
        for path in site.glob("*.py"):
            sys.modules.pop(path.stem, None)
