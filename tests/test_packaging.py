"""Every package folder is listed in pyproject.toml (package-dir maps registry/, envs/, recipes/)."""

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


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
