"""A list of environments given again replaces the earlier list whole.

jsonargparse merges a list given again element by element when the two lengths match: after a recipe's
`env: [{id: reverse-text, args: {min_words: 1}}]`, an overlay file's `env: [{id: arithmetic}]` (or the
flag `--data.env "[{id: arithmetic}]"`) gave arithmetic reverse-text's args (and name, ratio and
env_args): a loud "bad args" error when the new taskset refuses them, a silently different task when it
accepts them (both tasksets have `num_tasks`). A reader of the two files expects the overlay's list,
each entry with the defaults of what it does not say, as for a swapped component
(grpokit.cli.component_args). So grpokit replays the recipe's sources in order (each `--config` file,
then each flag, as jsonargparse reads them), finds the fields that the last list given wrote for each
entry, and resets every other field to EnvSpec's default, saying on stderr what it dropped.

`--data.env+=...` appends entries (jsonargparse gives them nothing to merge with); a flag on one field
(`--data.env.args ...`) sets that field of the last entry, as jsonargparse does. A source grpokit cannot
read (a `data` group given as a file path) leaves the parsed list as it is.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import Namespace

from grpokit.cli.recipe_files import CONFIG_FLAGS, read_recipe_file, recipe_flags

ENV_KEYS = ("data.env", "data.eval.env")
FIELD_DEFAULTS = {"args": {}, "name": None, "ratio": None, "env_args": {}, "judge": None}  # EnvSpec's fields but id
ABSENT, UNKNOWN = object(), object()  # a source that does not set the key; one grpokit cannot read


def reset_carried_env_args(argv: list[str], config: Namespace) -> list[str]:
    """Reset, in `config` (the parsed recipe), every field that an environment entry carried over from the
    entry of an earlier list at its index to EnvSpec's default; return one line per entry reset (also
    printed to stderr)."""
    notes = []
    for key in ENV_KEYS:
        specs = _get(config, key) or []
        given = _given_fields(argv, key)
        if given is None or len(given) != len(specs):
            continue
        for i, (spec, fields) in enumerate(zip(specs, given)):
            dropped = _reset(spec, fields)
            if dropped:
                listed = ", ".join(f"{name} {value!r}" for name, value in dropped.items())
                notes.append(
                    f"{key}[{i}]: {_id(spec)!r} is in a list given again, which replaces the earlier list "
                    f"whole; dropped what it carried from the earlier entry {i}: {listed}. Give them in "
                    "the same list to set them."
                )
    for line in notes:
        print(f"grpokit: {line}", file=sys.stderr)
    return notes


def _reset(spec: Any, fields: set[str]) -> dict[str, Any]:
    """Set each field of `spec` not in `fields` to its default; the fields changed, with their old values."""
    dropped = {}
    for name, default in FIELD_DEFAULTS.items():
        value = spec.get(name, default) if isinstance(spec, dict) else getattr(spec, name, default)
        if name in fields or value == default or (value is None and default == {}):
            continue
        dropped[name] = value
        if isinstance(spec, dict):
            spec[name] = type(default)() if isinstance(default, dict) else default
        else:
            setattr(spec, name, type(default)() if isinstance(default, dict) else default)
    return dropped


def _given_fields(argv: list[str], key: str) -> list[set[str]] | None:
    """For each entry of the list `key` as the sources leave it, the fields a source wrote since the list
    was last given whole; None when a source cannot be read (the parsed list is then left alone)."""
    given: list[set[str]] = []
    for flag, value in recipe_flags(argv):
        append = flag == key + "+"
        if flag in CONFIG_FLAGS:
            items = _lookup(_config_tree(value), key)
        elif flag in (key, key + "+"):
            items = _yaml(value)
        elif key.startswith(flag + "."):  # `--data "{env: [...]}"` gives the list inside a group
            items = _lookup(_yaml(value), key[len(flag) + 1 :])
        elif flag.startswith(key + ".") and given:  # `--data.env.args ...`: a field of the last entry
            given[-1].add(flag[len(key) + 1 :].split(".")[0])
            continue
        else:
            continue
        if items is ABSENT:
            continue
        if items is UNKNOWN or not (items is None or isinstance(items, list) or (append and isinstance(items, dict))):
            return None
        items = [] if items is None else items if isinstance(items, list) else [items]
        fields = [set(item) if isinstance(item, dict) else set(FIELD_DEFAULTS) for item in items]
        given = given + fields if append else fields
    return given


def _config_tree(value: str) -> Any:
    """A `--config` value's contents: the file's, or the value itself when it is inline YAML."""
    if Path(value).is_file():
        return read_recipe_file(value)
    return _yaml(value)


def _yaml(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError:
        return UNKNOWN


def _lookup(tree: Any, key: str) -> Any:
    """The value at the dotted `key` in a source's tree; ABSENT when it has none, UNKNOWN when a group on
    the way is not a mapping (a file path jsonargparse reads itself)."""
    if tree is UNKNOWN:
        return UNKNOWN
    for part in key.split("."):
        if tree is None:
            return ABSENT
        if not isinstance(tree, dict):
            return UNKNOWN
        if part not in tree:
            return ABSENT
        tree = tree[part]
    return tree


def _get(config: Namespace, key: str) -> Any:
    try:
        return config[key]
    except (KeyError, TypeError):
        return None


def _id(spec: Any) -> Any:
    return spec.get("id") if isinstance(spec, dict) else getattr(spec, "id", None)
