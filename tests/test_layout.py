"""The package's shape, checked: no import cycle (function-local imports included), no use of a moved
module's old path inside grpokit, every module in CONTRIBUTING's layout map, no function over 60 lines
but those docs/architecture.md names with a reason, and the old module paths still importable."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

from grpokit.moved import MOVED

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "grpokit"
MAX_FUNCTION_LINES = 60


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported_names(path: Path) -> set[str]:
    """Every module name an import statement in `path` names (top-level or inside a function), with
    `from pkg import name` counted as pkg.name too (it may be a submodule). Imports under
    `if TYPE_CHECKING:` are left out: they never run."""
    names: set[str] = set()
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in _runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _runtime_nodes(tree: ast.AST):
    """Every node of `tree` but those under `if TYPE_CHECKING:` (type-only imports run nowhere)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if (
                isinstance(child, ast.If)
                and getattr(child.test, "id", getattr(child.test, "attr", "")) == "TYPE_CHECKING"
            ):
                stack.extend(child.orelse)
                continue
            stack.append(child)


def import_graph() -> dict[str, set[str]]:
    found = modules()
    return {name: {n for n in imported_names(path) if n in found and n != name} for name, path in found.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_in_grpokit():
    assert cycles(import_graph()) == []


def test_the_cycle_check_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_grpokit_uses_no_old_module_path():
    found = modules()
    used = {
        (name, n) for name, path in found.items() if name != "grpokit.moved" for n in imported_names(path) if n in MOVED
    }
    assert used == set()


def test_every_old_module_path_imports_the_moved_module():
    for old, new in MOVED.items():
        assert importlib.import_module(old) is importlib.import_module(new), old
        assert importlib.import_module(old).__spec__.name == new


def test_an_old_class_path_resolves():
    from jsonargparse import ArgumentParser
    from lightning.pytorch.loggers import Logger

    parser = ArgumentParser()
    parser.add_subclass_arguments(Logger, "logger")
    config = parser.parse_args(
        ["--logger", '{"class_path": "grpokit.loggers.ResumableCSVLogger", "init_args": {"save_dir": "x"}}']
    )
    logger = parser.instantiate_classes(config).logger
    assert type(logger).__module__ == "grpokit.trainer.loggers"


def layout_map_paths() -> set[str]:
    """The paths CONTRIBUTING.md's layout block lists: an indented tree, one entry per line, folders
    ending in '/', a line's path relative to the folder above it."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    paths, folders = set(), []  # folders: (indent, path) of the open folders
    for line in block.splitlines():
        match = re.match(r"( *)(\S+)", line)
        if not match or match.group(2).startswith(("```", "#")):
            continue
        indent, entry = len(match.group(1)), match.group(2)
        while folders and folders[-1][0] >= indent:
            folders.pop()
        path = (folders[-1][1] if folders else "") + entry
        for name in entry.split(","):  # "a.py,b.py" is allowed for siblings
            paths.add((folders[-1][1] if folders else "") + name)
        if entry.endswith("/"):
            folders.append((indent, path))
    return paths


def test_contributing_layout_map_lists_every_module():
    listed = layout_map_paths()
    missing = [
        str(p.relative_to(ROOT)) for p in sorted(PACKAGE.rglob("*.py")) if str(p.relative_to(ROOT)) not in listed
    ]
    assert missing == [], f"add these to CONTRIBUTING.md's layout map: {missing}"
    stale = [p for p in listed if p.startswith("grpokit/") and p.endswith(".py") and not (ROOT / p).exists()]
    assert stale == [], f"CONTRIBUTING.md's layout map lists modules that do not exist: {stale}"


def long_functions() -> dict[str, int]:
    """`module:qualname` -> lines (def line to the body's end, decorators excluded) over the limit."""
    out: dict[str, int] = {}
    for module, path in modules().items():
        _collect_long(ast.parse(path.read_text()), f"{module}:", out)
    return out


def _collect_long(node: ast.AST, prefix: str, out: dict[str, int]) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.ClassDef):
            _collect_long(child, f"{prefix}{child.name}.", out)
        elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = child.end_lineno - child.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                out[f"{prefix}{child.name}"] = lines
            _collect_long(child, f"{prefix}{child.name}.", out)


def test_no_function_over_60_lines_but_those_named_with_a_reason():
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Functions over 60 lines", 1)[1].split("\n## ", 1)[0]
    bullets = re.findall(r"^- (.+?): \S", section, flags=re.M)  # "- `a:f`, `b:g`: the reason"
    named = {name for bullet in bullets for name in re.findall(r"`([\w.]+:[\w.]+)`", bullet)}
    found = set(long_functions())
    assert found - named == set(), (
        f"split these or name them, with a reason, in docs/architecture.md: {sorted(found - named)}"
    )
    assert named - found == set(), (
        f"docs/architecture.md names functions that are no longer long: {sorted(named - found)}"
    )


def test_an_old_run_folder_resumes(tmp_path, tiny_model):
    """A run's config.yaml written before the move (old class paths) parses, and the run resumes from it."""
    import csv

    from grpokit.main import main
    from grpokit.testing import tiny_fit_argv

    argv = tiny_fit_argv(tmp_path, tiny_model, "old", "--trainer.max_steps", "2", "--ckpt.interval", "1")
    assert main(argv) == 0
    config = tmp_path / "old" / "config.yaml"
    text = config.read_text()
    for old, new in MOVED.items():
        text = text.replace(new + ".", old + ".")
    assert "grpokit.loggers.ResumableCSVLogger" in text  # what a run of the old layout wrote
    config.write_text(text)
    resume = [
        "--run_name",
        "old",
        "--output_dir",
        str(tmp_path),
        "--ckpt.resume_step",
        "-1",
        "--trainer.max_steps",
        "3",
    ]
    assert main(["fit", "--config", str(config), *resume]) == 0
    rows = [r for r in csv.DictReader(open(tmp_path / "old" / "metrics.csv")) if r.get("loss")]
    assert [int(r["step"]) for r in rows] == [0, 1, 2]
