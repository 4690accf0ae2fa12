"""Discovery and listing of components: one abstract base class per kind, a subclass per component.

Importing a subclass registers it (jsonargparse resolves a short class name among the imported
subclasses of the type a recipe key expects, and errors naming every class path when a name is
ambiguous). `discover()` imports the built-ins and every `grpokit.registry` entry point; every grpokit
process calls it before parsing a recipe.

(This module is `components`, not `registry`: `grpokit.registry` is the catalog package itself.)
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import pkgutil
from dataclasses import dataclass

from grpokit.advantage import Advantage
from grpokit.broadcast import WeightBroadcast
from grpokit.filter import Filter
from grpokit.inference import InferenceEngine
from grpokit.loss import Loss
from grpokit.noise import NoiseScheduler
from grpokit.transport import Transport

KINDS: dict[str, type] = {
    "loss": Loss,
    "advantage": Advantage,
    "filter": Filter,
    "noise": NoiseScheduler,
    "transport": Transport,
    "broadcast": WeightBroadcast,
    "inference": InferenceEngine,
}
BUILTIN_PACKAGES = ["grpokit.registry", "grpokit.transport", "grpokit.broadcast", "grpokit.inference"]
# Subpackages that define no component: `grpokit infer`'s HTTP server (starlette, uvicorn) loads on use only.
NOT_COMPONENTS = ("grpokit.inference.server",)
ENTRY_POINT_GROUP = "grpokit.registry"


@dataclass(frozen=True)
class Component:
    kind: str
    name: str
    class_path: str
    summary: str


def discover() -> None:
    """Import built-in components and every `grpokit.registry` entry point (idempotent)."""
    for package_name in BUILTIN_PACKAGES:
        package = importlib.import_module(package_name)
        for module in pkgutil.walk_packages(package.__path__, prefix=f"{package_name}."):
            if not module.name.startswith(NOT_COMPONENTS):
                importlib.import_module(module.name)
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            ep.load()
        except Exception as e:
            dist = getattr(getattr(ep, "dist", None), "name", None)
            raise ImportError(
                f"grpokit plugin entry point {ep.name!r} = {ep.value!r} failed to import: {e}; fix that module, "
                f"or uninstall the package that declares it ({dist or 'its distribution'}): every grpokit "
                "command loads the installed plugins"
            ) from e


def components(kind: str | None = None) -> list[Component]:
    """Every concrete subclass of each kind's base class (built-ins and plugins), sorted by kind and name."""
    if kind is not None and kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; kinds are: {', '.join(KINDS)}")
    out = []
    for k, base in KINDS.items():
        if kind not in (None, k):
            continue
        for cls in _subclasses(base):
            if inspect.isabstract(cls) or cls.__name__.startswith("LazyInstance_"):
                continue  # LazyInstance_*: jsonargparse's stand-ins for lazy_instance defaults, not components
            doc = inspect.getdoc(cls) or ""
            out.append(
                Component(k, cls.__name__, f"{cls.__module__}.{cls.__qualname__}", doc.splitlines()[0] if doc else "")
            )
    return sorted(set(out), key=lambda c: (list(KINDS).index(c.kind), c.name, c.class_path))


def clashes(found: list[Component]) -> list[str]:
    """Short names that more than one class path of the same kind uses, as error lines naming both."""
    by_name: dict[tuple[str, str], list[str]] = {}
    for c in found:
        by_name.setdefault((c.kind, c.name), []).append(c.class_path)
    return [
        f"{kind} {name!r} is ambiguous: {' and '.join(paths)} (use a full class path)"
        for (kind, name), paths in by_name.items()
        if len(paths) > 1
    ]


def _subclasses(cls: type) -> list[type]:
    seen, stack = [], list(cls.__subclasses__())
    while stack:
        sub = stack.pop()
        if sub not in seen:
            seen.append(sub)
            stack.extend(sub.__subclasses__())
    return seen
