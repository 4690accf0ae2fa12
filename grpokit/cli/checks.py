"""Start-up checks of a parsed recipe that no single component can make: values that only go wrong in
combination with another section, and the run folder's location. They run before anything is built
(no model load, no sampling), so a bad value costs a second, not a run.

Also fills the seeds a recipe left null from `seed_everything`, so that the recorded config.yaml says
which seeds ran and a sweep over seed_everything gives replicates that really differ.
"""

from __future__ import annotations

import os
from pathlib import Path

from grpokit.inference import SamplingSettings


def check_recipe(config, role: str = "fit") -> None:
    """Every check below, in the order a user would fix them."""
    check_max_steps(config.trainer.max_steps, role)
    check_run_location(config.output_dir, config.run_name)
    check_lengths(config.data)
    check_server_port(getattr(getattr(config, "server", None), "port", None))
    fill_seeds(config)


def check_max_steps(max_steps: int | None, role: str) -> None:
    """A positive number of GRPO steps, or -1 in `grpokit fit`: one pass over the data (the rollout loop
    counts it once the environments are loaded; the separate roles of a multi-process run must agree on
    a number before any of them has loaded them)."""
    if max_steps == -1 and role != "fit":
        raise ValueError(
            f"trainer.max_steps -1 (one pass over the data) is counted by `grpokit fit`; `grpokit {role}` "
            "needs the number: take it from the log line of a `grpokit fit` start, or count it yourself"
        )
    if max_steps is None or (max_steps < 1 and max_steps != -1):
        raise ValueError(
            f"trainer.max_steps must be a positive number of GRPO steps (or -1: one pass over the data), "
            f"got {max_steps}"
        )


def check_run_location(output_dir: str, run_name: str | None) -> None:
    """run_name is one folder inside output_dir (`../x` or `a/b` would write elsewhere), and output_dir is
    a folder this process can write to (else the start fails later, inside a library, on the first file)."""
    if run_name is not None and (
        not run_name or run_name in (".", "..") or Path(run_name).name != run_name or "\\" in run_name
    ):
        raise ValueError(
            f"run_name {run_name!r} must be one plain folder name (no '/', no '..'): the run is written to "
            "output_dir/run_name; set output_dir to choose where"
        )
    existing = Path(output_dir)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(
            f"output_dir {output_dir!r}: cannot create or write run folders in {str(existing)!r} "
            "(not a writable folder); set output_dir to a folder you can write to"
        )


def check_lengths(data) -> None:
    """A completion of data.sampling.max_tokens plus its prompt is packed into data.seq_len tokens: a cap
    at or over seq_len is certain to fail, after a whole step of sampling."""
    sampling = getattr(data, "sampling", None)
    max_tokens = SamplingSettings.max_tokens if sampling is None else sampling.max_tokens
    if max_tokens >= data.seq_len:
        raise ValueError(
            f"data.sampling.max_tokens ({max_tokens}) must be below data.seq_len ({data.seq_len}): a prompt and "
            "its completion are packed into seq_len tokens; raise data.seq_len or lower data.sampling.max_tokens"
        )


def check_server_port(port: int | None) -> None:
    """server.port is a TCP port (1..65535): `grpokit infer` (and `grpokit fit` running vLLM itself) binds
    it only after the model has loaded, where 70000 failed with socket's OverflowError traceback."""
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(
            f"server.port must be a TCP port in [1, 65535], got {port}; set server.port to a free port (e.g. 8000)"
        )


def fill_seeds(config) -> None:
    """data.seed null -> seed_everything (the sampling seed follows data.seed unless set): replicates over
    seed_everything then differ in prompt order and rollouts, as a replicate must."""
    seed = getattr(config, "seed_everything", None)  # an int, or before Lightning draws one: True (random)
    if getattr(config.data, "seed", None) is None and isinstance(seed, int) and not isinstance(seed, bool):
        config.data.seed = int(seed)


def check_vision_engine(policy, engine) -> None:
    """model.vision.train with LoRA trains the projector or tower beside the adapter (peft modules_to_save),
    which only BuiltinEngine loads: a server engine's LoRA (vLLM's, a served adapter) is the adapter alone."""
    if engine.servers_load_weights and policy.lora is not None and policy.vision.train:
        raise ValueError(
            f"model.vision.train {policy.vision.train} with model.lora trains them beside the adapter, which "
            f"{type(engine).__name__}'s servers cannot load: sample with BuiltinEngine, or train them with full "
            "weights (model.lora: null)"
        )
