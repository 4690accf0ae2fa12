"""What a data.env id must name: a module that is an environment, checked before verifiers loads it.

An id that is not built in is looked up as an installed module (verifiers' loader). One that names a
module that is not an environment (`json`, `grpokit`, any package without a Taskset) used to end the
start with verifiers' TypeError or AttributeError traceback, which names neither data.env nor the fix.
"""

from __future__ import annotations


def check_taskset_module(env_id: str, builtin_ids: list[str]) -> None:
    """Refuse an id whose module exports no verifiers Taskset subclass in `__all__`, naming data.env, the
    id, the module and the fix. A module that cannot be imported is left to the caller (verifiers' own
    ModuleNotFoundError names what it tried)."""
    import verifiers.v1 as vf
    from verifiers.v1.utils.loaders import import_taskset

    module = import_taskset(env_id)
    names = getattr(module, "__all__", None)
    exported = [getattr(module, n, None) for n in names or []]
    if any(isinstance(obj, type) and issubclass(obj, vf.Taskset) and obj is not vf.Taskset for obj in exported):
        return
    why = "defines no `__all__`" if names is None else f"exports no verifiers Taskset subclass in `__all__` {names[:8]}"
    raise ValueError(
        f"data.env id {env_id!r} names the module {module.__name__!r}, which is not an environment (it {why}); "
        f"set data.env id to a built-in environment ({', '.join(builtin_ids)}) or to an installed taskset "
        "package, whose module exports its Taskset subclass via `__all__` (e.g. `__all__ = ['MyTaskset']`)"
    )
