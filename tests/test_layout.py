"""The package's shape, checked: no import cycle and no import of a higher layer (function-local imports
included), every module in CONTRIBUTING's layout map, no function over 60 lines but those
docs/architecture.md names with a reason."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "grpokit"
MAX_FUNCTION_LINES = 60


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported_names(path: Path, name: str | None = None) -> set[str]:
    """Every module name an import statement in `path` names (top-level or inside a function), with
    `from pkg import name` counted as pkg.name too (it may be a submodule). Imports under
    `if TYPE_CHECKING:` are left out: they never run. `name`: the module's name, when it is not its path's
    (registry/ and envs/ install as grpokit.registry and grpokit.envs)."""
    names: set[str] = set()
    name = name or module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
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


# The dependency rule (docs/architecture.md, "Package layout, and why"), lowest layer first. A package is
# the first name under grpokit ("" is grpokit/__init__.py). A module may import its own package and any
# package of a lower layer, or of its own layer, except among the roles: a role imports another only
# along an edge of ROLE_EDGES.
LAYERS = (
    ("plug-in API", {"", "types", "loss", "advantage", "filter", "noise", "kl", "normalization"}),
    ("common", {"common", "vision"}),
    ("plug-ins and their test kit", {"registry", "testing"}),
    ("roles", {"trainer", "orchestrator", "environments", "inference", "transport", "broadcast", "sft", "judges"}),
    ("environment plug-ins", {"envs"}),
    ("the recipe CLI", {"cli", "run"}),
    ("tools on the CLI", {"sweep", "bench", "evaluate", "export", "pretrain"}),
    ("the program", {"main", "__main__"}),
)
LAYER_OF = {package: i for i, (_, packages) in enumerate(LAYERS) for package in packages}
ROLES = LAYER_OF["trainer"]

# (importing roles, imported module, why): the only imports between roles, and the roles' one import of a
# higher layer (finding a built-in environment by id). "pkg.*" is pkg and its modules. What two roles
# both need and no edge allows moves down to common/ (the packed logprobs, the ranks' collectives).
ROLE_EDGES = (
    ({"orchestrator"}, "grpokit.environments.*", "the producer drives the environments' turns and scores"),
    ({"orchestrator", "environments"}, "grpokit.inference", "rollouts are sampled from an InferenceEngine"),
    ({"orchestrator"}, "grpokit.inference.streams", "streaming rollouts run on the engine's GenerationStream"),
    ({"orchestrator"}, "grpokit.inference.finish", "batch metrics count each finish reason the engines record"),
    ({"trainer", "orchestrator", "inference"}, "grpokit.broadcast", "weights go trainer -> engine via WeightBroadcast"),
    ({"inference"}, "grpokit.broadcast.nccl", "vLLM's worker extension is the NCCL broadcast's receiving end"),
    ({"trainer", "orchestrator"}, "grpokit.transport", "batches go orchestrator -> trainer through a Transport"),
    ({"orchestrator"}, "grpokit.transport.filesystem", "data.transport's default"),
    ({"trainer"}, "grpokit.transport.codec", "a non-finite step's batch is saved in the transport's format"),
    ({"environments"}, "grpokit.envs", "a built-in environment is found by id among the envs package's folders"),
    ({"sft"}, "grpokit.environments.*", "SFT chats are rendered as rollouts are, or built from environments' answers"),
    ({"sft"}, "grpokit.orchestrator.packing", "SFT examples are packed into micro-batches as rollouts are"),
    ({"orchestrator"}, "grpokit.sft.render", "Chord's SFT-dataset experts are rendered as `grpokit sft` renders"),
    ({"orchestrator"}, "grpokit.sft.sources", "Chord's SFT-dataset experts are read as `grpokit sft` reads them"),
    ({"orchestrator"}, "grpokit.judges.*", "the producer adds the judge rewards a recipe gives its environments"),
    ({"judges"}, "grpokit.environments.environment", "a judge's reward is added to an environment's rewards"),
    ({"judges"}, "grpokit.inference", "an in-process judge samples with the engine's SamplingSettings"),
    ({"judges"}, "grpokit.inference.builtin", "an in-process judge runs on a BuiltinEngine of its own"),
    ({"judges"}, "grpokit.inference.remote", "the HTTP judge refuses redirects as RemoteEngine does"),
    ({"judges"}, "grpokit.inference.server.*", "`grpokit judge` serves a judge on grpokit's HTTP server"),
)

# Plug-ins import less than their layer: these layers, these modules, and their own package. An
# environment uses the environment layer's public names (`from grpokit.environments import EnvTurn`).
PLUGIN_FOLDERS = {"registry": ROOT / "registry", "envs": ROOT / "envs"}
PLUGIN_IMPORTS = {
    "registry": {"plug-in API", "common"},
    "envs": {"plug-in API", "common", "grpokit.environments"},
}


def plugin_modules() -> dict[str, Path]:
    """registry/ and envs/ by the names they install as (grpokit.registry.*, grpokit.envs.*)."""
    out: dict[str, Path] = {}
    for package, folder in PLUGIN_FOLDERS.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            out[".".join(("grpokit", package, *(parts[:-1] if parts[-1] == "__init__" else parts)))] = path
    return out


def layer_graph() -> dict[str, set[str]]:
    """The import graph of grpokit/, registry/ and envs/ (module -> the modules it imports)."""
    found = {**modules(), **plugin_modules()}
    return {name: {n for n in imported_names(path, name) if n in found and n != name} for name, path in found.items()}


def package_of(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def may_import(importer: str, imported: str) -> bool:
    """Whether the dependency rule lets module `importer` import module `imported`."""
    src, dst = package_of(importer), package_of(imported)
    if src == dst:
        return True
    if src in PLUGIN_IMPORTS:
        return any(entry in (imported, LAYERS[LAYER_OF[dst]][0]) for entry in PLUGIN_IMPORTS[src])
    if LAYER_OF[dst] < LAYER_OF[src] or LAYER_OF[dst] == LAYER_OF[src] != ROLES:
        return True
    return any(src in importers and names(target, imported) for importers, target, _ in ROLE_EDGES)


def names(target: str, module: str) -> bool:
    """Whether a ROLE_EDGES target names `module` ("pkg.*": pkg and every module inside it)."""
    return module == target or (target.endswith(".*") and f"{module}.".startswith(target[:-1]))


def layer_breaks(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} -> {b}" for a, imported in graph.items() for b in imported if not may_import(a, b))


def test_every_package_has_a_layer():
    packages = {package_of(name) for name in layer_graph()}
    assert packages - set(LAYER_OF) == set(), "add the new package to a layer in LAYERS"
    assert set(LAYER_OF) - packages == set(), "LAYERS names packages that are gone"


def test_no_module_imports_a_higher_layer():
    breaks = layer_breaks(layer_graph())
    assert breaks == [], f"move what these share down a layer (or pass it in), or list the edge: {breaks}"


def test_every_role_edge_is_used():
    edges = [(package_of(a), b) for a, imported in layer_graph().items() for b in imported]
    unused = [
        f"{importer} -> {target}"
        for importers, target, _ in ROLE_EDGES
        for importer in sorted(importers)
        if not any(src == importer and names(target, b) for src, b in edges)
    ]
    assert unused == [], f"ROLE_EDGES allows imports nothing makes any more: drop them {unused}"


def test_the_layer_check_finds_a_break():
    graph = {
        "grpokit.common.models": {"grpokit.trainer.quantization", "grpokit.types"},
        "grpokit.orchestrator.kl_reward": {"grpokit.trainer.logprobs", "grpokit.inference", "grpokit.kl"},
        "grpokit.orchestrator.rollouts": {"grpokit.environments.multi_turn"},
        "grpokit.environments.multi_turn": {"grpokit.orchestrator.loop", "grpokit.inference"},
        "grpokit.envs.game": {"grpokit.environments", "grpokit.environments.conversation", "grpokit.envs.dataset"},
        "grpokit.registry.losses.x": {"grpokit.loss", "grpokit.common.io", "grpokit.testing"},
        "grpokit.cli.roles": {"grpokit.trainer.policy", "grpokit.run"},
    }
    assert layer_breaks(graph) == [
        "grpokit.common.models -> grpokit.trainer.quantization",
        "grpokit.environments.multi_turn -> grpokit.orchestrator.loop",
        "grpokit.envs.game -> grpokit.environments.conversation",
        "grpokit.orchestrator.kl_reward -> grpokit.trainer.logprobs",
        "grpokit.registry.losses.x -> grpokit.testing",
    ]


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
