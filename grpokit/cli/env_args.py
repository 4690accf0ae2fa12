"""An environment swapped on the command line starts from its own args, not the recipe's.

jsonargparse merges a list of environments given again element by element when the lengths match, so
after a recipe's `env: [{id: reverse-text, args: {min_words: 1}}]`, the flag
`--data.env "[{id: guess-number}]"` would give guess-number reverse-text's args: a loud error when the
new taskset refuses them, a silently different task when it accepts them (both tasksets have
`num_tasks`). A researcher who swaps an environment expects that environment's defaults, as for a
swapped component (grpokit.cli.component_args), so grpokit replays the recipe's sources in order and
clears, for every element whose id changed, the args (and env_args) not given since the change, saying
so on stderr.
"""

from __future__ import annotations

import sys
from typing import Any

import yaml
from jsonargparse import Namespace

from grpokit.cli.recipe_files import CONFIG_FLAGS, read_recipe_file, recipe_flags

ENV_KEYS = ("data.env", "data.eval.env")
ARG_FIELDS = ("args", "env_args")  # the taskset's config, and its verifiers Env's (grpokit.environments.episode_env)


def reset_carried_env_args(argv: list[str], config: Namespace) -> list[str]:
    """Clear, in `config` (the parsed recipe), the args each environment carried over from the one it
    replaced; return one line per cleared environment (also printed to stderr)."""
    notes = []
    for key in ENV_KEYS:
        for field in ARG_FIELDS:
            carried = _carried(argv, key, field)
            for i, spec in enumerate(_get(config, key) or []):
                args = spec.get(field) if isinstance(spec, dict) else getattr(spec, field, None)
                if i in carried and args:
                    notes.append(
                        f"{key}[{i}]: {_id(spec)!r} replaced an earlier environment; the {field} carried from "
                        f"it ({args}) are dropped. Give {field} in the same flag to set them."
                    )
                    if isinstance(spec, dict):
                        spec[field] = {}
                    else:
                        setattr(spec, field, {})
    for line in notes:
        print(f"grpokit: {line}", file=sys.stderr)
    return notes


def _carried(argv: list[str], key: str, field: str) -> set[int]:
    """The indices of `key`'s elements whose id was changed by a later source without `field`."""
    ids: dict[int, Any] = {}
    carried: set[int] = set()
    for flag, value in recipe_flags(argv):
        if flag in CONFIG_FLAGS:
            items, fresh = _lookup(read_recipe_file(value), key), True  # a file's list replaces the list
        elif flag == key:
            items = yaml.safe_load(value) if isinstance(value, str) else value
            fresh = False
        else:
            continue
        if not isinstance(items, list):
            continue
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                continue
            new_id = item.get("id", ids.get(i))
            if field in item or fresh:
                carried.discard(i)
            elif i in ids and new_id != ids[i]:
                carried.add(i)
            ids[i] = new_id
    return carried


def _lookup(tree: Any, key: str) -> Any:
    for part in key.split("."):
        if not isinstance(tree, dict):
            return None
        tree = tree.get(part)
    return tree


def _get(config: Namespace, key: str) -> Any:
    try:
        return config[key]
    except (KeyError, TypeError):
        return None


def _id(spec: Any) -> Any:
    return spec.get("id") if isinstance(spec, dict) else getattr(spec, "id", None)
