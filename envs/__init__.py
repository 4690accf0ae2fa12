"""Built-in environments, each a verifiers (v1) taskset; loaded by id (`reverse-text` -> reverse_text)."""

if __name__ != "grpokit.envs":
    raise ImportError(f"import grpokit.envs, not {__name__!r}")
