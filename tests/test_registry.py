"""Registry: listing, short names, class paths, ambiguity, and a third-party entry-point plugin."""

import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from grpokit.cli import make_cli
from grpokit.cli.discovery import components, discover
from grpokit.main import main

ROOT = Path(__file__).resolve().parents[1]
RECIPE = str(ROOT / "recipes" / "reverse_text.yaml")


def build(tmp_path, *overrides):
    return make_cli(["--config", RECIPE, "--output_dir", str(tmp_path), "--run_name", "t", *overrides], run=False)


def test_list_shows_builtins(capsys):
    assert main(["registry", "list"]) == 0
    out = capsys.readouterr().out
    for name in ["AIPO", "GroupNorm", "Overlong", "FilesystemTransport", "FilesystemBroadcast", "BuiltinEngine"]:
        assert name in out
    assert "grpokit.registry.losses.aipo.AIPO" in out
    names = {c.name for c in components("loss")}
    assert "AIPO" in names and "GroupNorm" not in names


def test_short_name_and_class_path_resolve_to_the_same_class(tmp_path):
    short = build(tmp_path, "--model.loss", "AIPO")
    full = build(
        tmp_path, "--model.loss", "grpokit.registry.losses.aipo.AIPO", "--model.loss.init_args.token_mask_high", "4"
    )
    assert type(short.model.loss) is type(full.model.loss)
    assert full.model.loss.token_mask_high == 4.0


def make_package(site, name, source):
    (site / name).mkdir(parents=True)
    (site / name / "__init__.py").write_text(textwrap.dedent(source))


def install_plugin(monkeypatch, site, module: str, dist_name: str, entry_name: str) -> None:
    """Declare `module` (a package in `site`) as the grpokit.registry entry point `entry_name` of an
    installed distribution `dist_name`, and put `site` on the path, as `pip install` would."""
    dist = site / f"{module}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[grpokit.registry]\n{entry_name} = {module}\n")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()


def test_ambiguous_short_name_names_both_class_paths(tmp_path):
    # In a subprocess: a second GroupNorm subclass must not leak into the other tests of this session.
    make_package(
        tmp_path / "site",
        "other_lab",
        """
        from grpokit.advantage import Advantage

        class GroupNorm(Advantage):
            \"\"\"Another lab's GroupNorm.\"\"\"

            def __call__(self, rewards_PG, lengths_PG):
                return rewards_PG
    """,
    )
    script = (
        "import other_lab, sys\n"
        "from grpokit.cli.discovery import clashes, components, discover\n"
        "discover()\n"
        "print(clashes(components('advantage')))\n"
        "from grpokit.main import main\n"
        f"main(['fit', '--config', {RECIPE!r}, '--output_dir', {str(tmp_path)!r}, '--print_config'])\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120
    )
    assert result.returncode != 0
    both = ("other_lab.GroupNorm", "grpokit.registry.advantages.group_norm.GroupNorm")
    assert all(p in result.stdout for p in both), result.stdout  # grpokit registry's clash report
    assert "data.advantage" in result.stderr and all(p in result.stderr for p in both), result.stderr


def test_entry_point_plugin_is_usable_by_short_name(tmp_path, monkeypatch):
    site = tmp_path / "site"
    make_package(
        site,
        "lab_plugin",
        '''
        from grpokit.advantage import Advantage

        class CenteredOnly(Advantage):
            """r - group mean, no std scaling (a lab's own advantage)."""

            def __call__(self, rewards_PG, lengths_PG):
                return rewards_PG - rewards_PG.mean(-1, keepdim=True)
    ''',
    )
    install_plugin(monkeypatch, site, "lab_plugin", "lab-plugin", "lab")
    discover()
    assert "lab_plugin" in sys.modules
    assert any(c.class_path == "lab_plugin.CenteredOnly" for c in components("advantage"))
    cli = build(tmp_path, "--data.advantage", "CenteredOnly")
    assert type(cli.datamodule.settings.advantage).__module__ == "lab_plugin"


def test_only_grpokit_infer_imports_the_http_server_stack():
    """`grpokit fit`, `train` and `orchestrate` parse recipes after discover(): none of that may need
    starlette or uvicorn (the GPU image lacks them; they cost start-up time), which `grpokit infer`
    imports when it serves."""
    code = textwrap.dedent(
        """
        import sys
        import grpokit.main, grpokit.cli.roles
        from grpokit.cli.discovery import discover
        discover()
        print(sorted(m for m in ("uvicorn", "starlette") if m in sys.modules))
        from grpokit.inference.server import make_app  # the package's names still load on use
        print("uvicorn" in sys.modules)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["[]", "True"]


def test_a_plugin_that_does_not_import_stops_the_command_with_one_line(tmp_path, monkeypatch, capsys):
    """Every command loads the installed plugins; one whose module fails to import used to end every
    command (`grpokit registry list` too) with a traceback, as only ValueError and FileNotFoundError were
    printed as one line."""
    from grpokit.main import entry

    site = tmp_path / "site"
    make_package(site, "broken_lab", "import not_a_real_pkg\n")
    install_plugin(monkeypatch, site, "broken_lab", "broken-lab", "broken")
    monkeypatch.delenv("GRPOKIT_TRACEBACK", raising=False)
    assert entry(["registry", "list", "loss"]) == 2
    err = capsys.readouterr().err
    assert "grpokit: error: grpokit plugin entry point 'broken' = 'broken_lab' failed to import" in err
    assert "No module named 'not_a_real_pkg'" in err and "uninstall the package that declares it (broken-lab)" in err
    assert "Traceback" not in err
