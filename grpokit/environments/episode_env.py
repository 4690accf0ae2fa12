"""Which environments have an episode of their own: a verifiers `Env` subclass with its own
`run(task, agents)`, found by id, built with its config (grpokit.environments.episodes plays it).

An id names a taskset (`guess-number`) or, as verifiers names pairs, an Env and a taskset
(`user-sim+reverse-text`: verifiers' user-sim Env over grpokit's reverse-text tasks). The Env class is
the one the id names, else the one the taskset's package exports next to its Taskset (in `__all__`), else
none: the taskset's tasks are then prompts (single- or multi-turn) as usual. A module id is looked up as
a grpokit built-in (`grpokit.envs.<id>`), then as verifiers does (an installed module, then
`verifiers.v1.envs` / `verifiers.v1.tasksets`).

The Env is built without verifiers' `Env.__init__`, which loads a harness per role and the taskset
through verifiers' own loader: grpokit plays every role with its engine and has the taskset already. Its
`config` (the `env_args` of data.env, validated by the Env's config class) and `taskset` are set, which
is what the Env's `setup`, `run` and `finalize` read.
"""

from __future__ import annotations

import importlib
from typing import Any


def load_episode_env(spec, env_id: str, taskset: Any) -> Any | None:
    """The verifiers Env that runs the episodes of `spec` (with `taskset` as its taskset), or None when the
    environment has no `run` of its own. `env_args` without such an Env are an error naming data.env."""
    import pydantic
    import verifiers.v1 as vf
    from verifiers.v1.utils.generic import concrete_type

    cls = _env_class(env_id, spec.id.rpartition("+")[2])
    if cls is None or cls.run is vf.SingleAgentEnv.run:
        if spec.env_args:
            raise ValueError(
                f"data.env id {spec.id!r}: env_args {spec.env_args} given, but the environment has no verifiers "
                "Env with a run of its own; drop env_args, or pair an Env with the taskset (id: env+taskset)"
            )
        return None
    config_cls = concrete_type(cls, vf.EnvConfig, origin=vf.Env) or vf.EnvConfig
    try:
        config = config_cls.model_validate(spec.env_args)
    except pydantic.ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise ValueError(f"data.env id {spec.id!r}: bad env_args {spec.env_args}: {problems}") from e
    env = cls.__new__(cls)
    env.config, env.taskset = config, taskset
    return env


def _env_class(env_id: str, taskset_id: str) -> type | None:
    import verifiers.v1 as vf
    from verifiers.v1.utils import loaders

    if env_id:
        module = _builtin_module(env_id)
        if module is not None:
            return _exported_env(module) or _refuse(env_id, module)
        try:
            return loaders.environment_class("", env_id)
        except ModuleNotFoundError as e:
            raise ValueError(f"data.env: unknown verifiers Env {env_id!r} in id {env_id}+{taskset_id}: {e}") from e
    module = _builtin_module(taskset_id)
    if module is not None:
        return _exported_env(module)
    try:
        return loaders.environment_class(taskset_id)
    except (ModuleNotFoundError, ValueError):  # the taskset loader reports a taskset it cannot find
        return vf.SingleAgentEnv


def _builtin_module(ident: str):
    name = ident.split("/")[-1].split("@")[0].replace("-", "_").lower()
    try:
        return importlib.import_module(f"grpokit.envs.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"grpokit.envs.{name}":
            raise
        return None


def _exported_env(module) -> type | None:
    import verifiers.v1 as vf

    found = [
        obj
        for name in getattr(module, "__all__", [])
        if isinstance(obj := getattr(module, name, None), type) and issubclass(obj, vf.Env) and obj is not vf.Env
    ]
    if len(found) > 1:
        raise ValueError(f"environment module {module.__name__} exports {len(found)} verifiers Envs; export one")
    return found[0] if found else None


def _refuse(env_id: str, module) -> None:
    raise ValueError(f"data.env: {module.__name__} (Env id {env_id!r}) exports no verifiers Env subclass in __all__")
