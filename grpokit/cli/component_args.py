"""How a recipe names its components: names checked before parsing, and swaps that reset settings.

A component name that matches no class of its kind (`--model.loss AIPOO`) fails before jsonargparse
parses the recipe, whose own message ("Expected a dot import path string: AIPOO") names neither the
kind nor the known names: `check_component_names` names the key, the closest known names and
`grpokit registry list KIND`.

Swapping a component resets its settings to the new class's defaults.

jsonargparse, on purpose, keeps the init_args that the old and the new class share when a later
source (an overlay file or a command-line flag) changes a component's class_path: after the recipe's
`ClippedPG` (eps_low 0.2, eps_high 0.28), `--model.loss GSPO` would train GSPO with a clip range 500x
its own default (3e-4, 4e-4), and a user filter would inherit the recipe filter's `enforce: true`.
A researcher who swaps a component in one line expects that component's defaults, so grpokit replays
the recipe's sources in order (each `--config` file, then each flag, as jsonargparse reads them),
finds, for every component, the arguments set since its class last changed, and resets the other
carried arguments to the new class's defaults, saying so on stderr.

A list of components (`data.filters`) given again replaces the earlier list whole, as a reader of the
recipe and its overlay expects. jsonargparse instead merges it element by element when the lengths match
(an overlay's `filters: [{class_path: Overlong}]` kept the recipe's `enforce: true`), so each element is
tracked by its index, and an element of a list given again is reset to its class's defaults but for
what that list (or a later flag) sets.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import sys
from dataclasses import dataclass, field

import yaml
from jsonargparse import Namespace

from grpokit.cli.discovery import components
from grpokit.cli.recipe_files import CONFIG_FLAGS, read_recipe_file, recipe_flags

COMPONENT_KEYS = {  # recipe key -> registry kind (grpokit.cli.discovery.KINDS)
    "model.loss": "loss",
    "model.noise_scheduler": "noise",
    "data.advantage": "advantage",
    "data.filters": "filter",
    "data.transport": "transport",
    "inference": "inference",
    "broadcast": "broadcast",
}

EXAMPLE_PATHS = {  # registry kind -> an import path shaped like a user's own class, for error messages
    "loss": "my_lab.losses.MyLoss",
    "noise": "my_lab.noise.MyNoise",
    "advantage": "my_lab.advantages.MyAdvantage",
    "filter": "my_lab.filters.MyFilter",
    "transport": "my_lab.transports.MyTransport",
    "inference": "my_lab.engines.MyEngine",
    "broadcast": "my_lab.broadcasts.MyBroadcast",
}


@dataclass
class _History:
    cls: str | None = None  # the class the sources last named (short name or class path)
    switched: bool = False  # a source named a different class after an earlier one
    explicit: set[str] = field(default_factory=set)  # init_args given since the last class change
    fresh: bool = False  # an element of a list given again: nothing carries from the earlier element


def _short(cls: str) -> str:
    return cls.rsplit(".", 1)[-1]


def _set_class(h: _History, cls: str) -> None:
    if h.cls is not None and _short(h.cls) != _short(cls):
        h.switched, h.explicit = True, set()
    h.cls = cls


def _apply_value(h: _History, value) -> None:
    """A source's value for the component: a class name, or a dict with class_path and/or init_args."""
    if isinstance(value, str):
        parsed = yaml.safe_load(value) if value.lstrip().startswith("{") else value
        if isinstance(parsed, str):
            _set_class(h, parsed)
            return
        value = parsed
    if not isinstance(value, dict):
        return
    if isinstance(value.get("class_path"), str):
        _set_class(h, value["class_path"])
    args = (
        value.get("init_args")
        if isinstance(value.get("init_args"), dict)
        else {k: v for k, v in value.items() if k not in ("class_path", "init_args", "dict_kwargs")}
    )
    h.explicit |= set(args)


def _is_component(value) -> bool:
    return (
        isinstance(value, Namespace)
        and isinstance(getattr(value, "class_path", None), str)
        and isinstance(getattr(value, "init_args", None), Namespace)
    )


def _component_keys(config: Namespace, prefix: str = "") -> tuple[list[str], list[str]]:
    """Dotted keys of every single component in a parsed config, and of every list of components."""
    single, lists = [], []
    for name, value in vars(config).items():
        key = f"{prefix}{name}"
        if _is_component(value):
            single.append(key)
        elif isinstance(value, Namespace):
            more = _component_keys(value, key + ".")
            single, lists = single + more[0], lists + more[1]
        elif isinstance(value, list) and value and all(_is_component(v) for v in value):
            lists.append(key)
    return single, lists


def _lookup(tree, key: str):
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return None
        tree = tree[part]
    return tree


def _default_class(default) -> str | None:
    """The class of a parser default: a Namespace with class_path, or a lazy_instance (a subclass of it)."""
    if isinstance(default, Namespace):
        return default.class_path if isinstance(getattr(default, "class_path", None), str) else None
    if default is None or isinstance(default, (str, int, float, bool, list, dict)):
        return None
    cls = type(default)
    return cls.__mro__[1].__name__ if cls.__name__.startswith("LazyInstance") else cls.__name__


def _histories(
    argv: list[str], keys: list[str], list_keys: list[str], defaults: Namespace | None
) -> dict[str, _History]:
    """The history of each single component (by key) and of each element of a list of components (by
    `key[i]`: jsonargparse merges a list given again element by element)."""
    histories = {k: _History(cls=_default_class(_get(defaults, k))) for k in keys}
    lengths = dict.fromkeys(list_keys, 0)
    for flag, value in recipe_flags(argv):
        if flag in CONFIG_FLAGS:
            _apply_config(histories, lengths, keys, list_keys, value)
            continue
        for k in list_keys:
            if flag in (k, k + "+"):
                _apply_list(histories, lengths, k, value, append=flag.endswith("+"))
            elif flag.startswith(k + ".") and lengths[k]:  # a setting of the last element, as jsonargparse
                _apply_flag(histories[f"{k}[{lengths[k] - 1}]"], k, flag, value)
        for k in keys:
            _apply_flag(histories[k], k, flag, value)
    return histories


def _apply_list(histories: dict[str, _History], lengths: dict[str, int], key: str, value, append: bool) -> None:
    """Apply a list of components given for the list key `key` (a YAML string or the parsed list; a single
    item counts as a list of one) to the histories of its elements `key[i]`: after the `lengths[key]`
    elements so far when `append` (`--key+`), else from element 0; then update `lengths[key]`."""
    items = yaml.safe_load(value) if isinstance(value, str) and value.strip()[:1] in ("[", "{") else value
    items = items if isinstance(items, list) else [items]
    start = lengths[key] if append else 0
    for i, item in enumerate(items, start):
        if not append:  # the list replaces the earlier one: its elements start afresh
            histories[f"{key}[{i}]"] = _History(fresh=i < lengths[key])
        _apply_value(histories.setdefault(f"{key}[{i}]", _History()), item)
    lengths[key] = start + len(items) if append else len(items)


def _apply_config(
    histories: dict[str, _History], lengths: dict[str, int], keys: list[str], list_keys: list[str], value: str
) -> None:
    """Apply a config file (the value of `--config`/`-c`) to the history of every single component and every
    list of components that it sets; a list it sets replaces the elements given so far."""
    tree = read_recipe_file(value)
    for k in keys:
        node = _lookup(tree, k)
        if node is not None:
            _apply_value(histories[k], node)
    for k in list_keys:
        node = _lookup(tree, k)
        if node is not None:
            _apply_list(histories, lengths, k, node, append=False)


def _apply_flag(h: _History, key: str, flag: str, value: str) -> None:
    """Apply one command-line flag to `h`, the history of the single component `key`, if the flag sets it:
    the whole component, its class_path, its init_args, or one of its settings (recorded as explicit)."""
    if flag == key:
        _apply_value(h, value)
    elif flag == f"{key}.class_path":
        _set_class(h, value)
    elif flag == f"{key}.init_args":
        _apply_value(h, {"init_args": yaml.safe_load(value)})
    elif flag.startswith(key + "."):
        rest = flag[len(key) + 1 :].removeprefix("init_args.")
        if rest:
            h.explicit.add(rest.split(".")[0])  # `serve.port` sets part of `serve`: keep all of it


def _get(config: Namespace | None, key: str):
    if config is None:
        return None
    try:
        return config[key]
    except (KeyError, TypeError):
        return None


def _class_defaults(class_path: str) -> dict:
    module, name = class_path.rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)
    return {
        n: p.default
        for n, p in inspect.signature(cls.__init__).parameters.items()
        if p.default is not inspect.Parameter.empty
    }


def reset_carried_init_args(argv: list[str], config: Namespace, defaults: Namespace | None = None) -> list[str]:
    """Reset, in `config` (the parsed recipe), every init_arg that a component carried over from the class
    it replaced to the new class's default; return one line per reset component (also printed to stderr)."""
    notes = []
    for key, h in _histories(argv, *_component_keys(config), defaults).items():
        if not (h.switched or h.fresh):
            continue
        name, _, index = key.partition("[")
        if index and int(index[:-1]) >= len(config[name] or []):
            continue  # the list was given again, shorter
        node = config[name][int(index[:-1])] if index else config[key]
        class_defaults = _class_defaults(node.class_path)
        reset = {
            n: (getattr(node.init_args, n), class_defaults[n])
            for n in vars(node.init_args)
            if n not in h.explicit and n in class_defaults and getattr(node.init_args, n) != class_defaults[n]
        }
        for n, (_, default) in reset.items():
            setattr(node.init_args, n, default)
        if reset:
            changes = ", ".join(f"{n} {old!r} -> {new!r}" for n, (old, new) in reset.items())
            cls = _short(node.class_path)
            notes.append(
                f"{key}: {cls} replaced an earlier class; its settings carried from that class are reset to "
                f"{cls}'s defaults ({changes}). Give them after the class to keep other values."
                if h.switched
                else f"{key}: {cls} is in a list given again, which replaces the earlier list whole; its "
                f"settings carried from the earlier element are reset to {cls}'s defaults ({changes}). Give "
                "them in the same list to keep other values."
            )
    for line in notes:
        print(f"grpokit: {line}", file=sys.stderr)
    return notes


def _named_classes(value) -> list[str]:
    """The classes a source names for a component key: a name, a dict's class_path, or a list of those."""
    if isinstance(value, str):
        text = value.strip()
        value = yaml.safe_load(text) if text[:1] in ("{", "[") else text
        if isinstance(value, str):
            return [value] if value and value.lower() not in ("null", "none") else []
    if isinstance(value, list):
        return [name for item in value for name in _named_classes(item)]
    if isinstance(value, dict) and isinstance(value.get("class_path"), str):
        return [value["class_path"]]
    return []


def _component_names(argv: list[str]):
    """(source, key, class name) for every class that argv's config files and flags name for a component key."""
    for flag, value in recipe_flags(argv):
        if flag in CONFIG_FLAGS:
            tree = read_recipe_file(value)
            for key in COMPONENT_KEYS:
                for name in _named_classes(_lookup(tree, key)):
                    yield f"--config {value}", key, name
            continue
        flag = flag.rstrip("+")  # `--data.filters+=NAME` appends
        for key in COMPONENT_KEYS:
            if flag in (key, f"{key}.class_path"):
                for name in _named_classes(value):
                    yield f"--{flag}", key, name


def check_component_names(argv: list[str]) -> None:
    """Raise ValueError for a short component name (no dots) that no registered class of the key's kind
    has, naming the key, the closest names and where to list them; and for a class path whose module
    does not import, that lacks the class, or whose class is of another kind (jsonargparse's own message
    for these is a dozen lines of union alternatives, "Expected a <class 'NoneType'>" among them)."""

    for source, key, name in _component_names(argv):
        kind = COMPONENT_KEYS[key]
        if "." in name:
            _check_class_path(source, key, kind, name)
            continue
        known = [c.name for c in components(kind)]
        if name in known:
            continue
        elsewhere = sorted({c.kind for c in components() if c.name == name})
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.75)
        raise ValueError(
            f"{key}: no {kind} is named {name!r} ({source})"
            + (f"; {name} is of kind {' and '.join(elsewhere)}, not {kind}" if elsewhere else "")
            + (f"; did you mean {' or '.join(close)}?" if close else "")
            + f" Known {kind} names: {', '.join(known)} (`grpokit registry list {kind}`), or give "
            f"your class's import path ({EXAMPLE_PATHS.get(kind, 'my_lab.module.MyClass')})"
        )


def _check_class_path(source: str, key: str, kind: str, path: str) -> None:
    """Import `path` (module.Class) as jsonargparse will; raise ValueError naming the key and the fix when
    the module does not import, has no such class (the closest names offered) or the class is not of
    `kind`."""
    from grpokit.cli.discovery import KINDS

    where = f"{key}: {path} ({source})"
    parts, first_error, module = path.split("."), None, None
    for cut in range(len(parts) - 1, 0, -1):  # the longest importable prefix, as jsonargparse resolves it
        try:
            module = importlib.import_module(".".join(parts[:cut]))
            break
        except ModuleNotFoundError as e:
            first_error = first_error or e
            if not ".".join(parts[:cut]).startswith(str(e.name)):  # a module it imports is missing
                raise ValueError(f"{where}: cannot import {'.'.join(parts[:cut])} ({e})") from e
        except ImportError as e:
            raise ValueError(f"{where}: cannot import {'.'.join(parts[:cut])} ({e})") from e
    cls, owner = module, ".".join(parts[:cut])
    for name in parts[cut:]:  # the class, or Outer.Inner below the module
        found = getattr(cls, name, None) if cls is not None else None
        if found is None and first_error is not None and name == parts[cut]:
            raise ValueError(
                f"{where}: cannot import {'.'.join(parts[:-1])} ({first_error}); is its package installed or "
                "on PYTHONPATH?"
            ) from first_error
        if found is None:
            names = [n for n, v in vars(cls).items() if inspect.isclass(v) and not n.startswith("_")]
            close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
            raise ValueError(
                f"{where}: {owner} has no {name!r}" + (f"; did you mean {' or '.join(close)}?" if close else "")
            )
        cls, owner = found, f"{owner}.{name}"
    base = KINDS[kind]
    if not (inspect.isclass(cls) and issubclass(cls, base)):
        raise ValueError(
            f"{where}: {parts[-1]} is not a {base.__name__} subclass; {key} takes a {kind} "
            f"(`grpokit registry list {kind}`, docs/custom-components.md)"
        )
