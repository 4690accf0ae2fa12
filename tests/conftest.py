"""Shared fixtures: a tiny random Llama with the SmolLM2 tokenizer, built once per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from grpokit.testing import build_tiny_model

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-llama")))


@pytest.fixture(scope="session")
def straight_sync_fit(tmp_path_factory):
    """The uninterrupted `grpokit fit` (a fresh process) that tests/faults/test_signals.py and
    tests/trainer/test_interrupt.py compare their stopped-and-resumed runs with: both would run the same
    recipe, so it runs once per session. `start(argv)` takes the caller's `grpokit fit` arguments for
    that run (its --output_dir is replaced); the first call starts it in the background, alongside the
    caller's own run, and a later call must pass the same arguments. Returns (process, log, run folder)."""
    from tests.support.processes import start_grpokit

    started: dict = {}

    def start(argv: list[str]):
        at = argv.index("--output_dir") + 1
        recipe = argv[:at] + ["-"] + argv[at + 1 :]
        if not started:
            out = tmp_path_factory.mktemp("straight")
            proc, log = start_grpokit(out, argv[:at] + [str(out)] + argv[at + 1 :], "straight")
            run = out / argv[argv.index("--run_name") + 1]
            started.update(recipe=recipe, run=(proc, log, run))
        assert started["recipe"] == recipe, "the shared straight run is another recipe"
        return started["run"]

    yield start
    if started and started["run"][0].poll() is None:
        started["run"][0].kill()
        started["run"][0].wait()


@pytest.fixture(scope="session", autouse=True)
def _discover_components():
    from grpokit.cli.discovery import discover

    discover()
    torch.set_num_threads(min(2, os.cpu_count() or 1))


# The unit subset (`python3 -m pytest -q -m unit tests`, about a minute on 2 cores): loss/advantage/filter
# math, codecs and transports, the registry and contracts, recipe parsing and errors, packing and
# prompt order, the package layout. Everything under a listed folder is in it; add fast new files here.
UNIT_PATHS = (
    "registry/",
    "transport/",
    "envs/",
    "test_kl.py",
    "test_normalization.py",
    "test_contracts.py",
    "test_component_checks.py",
    "common/test_prefix_tree.py",
    "trainer/test_metrics.py",
    "common/test_io.py",
    "cli/test_parse_recipe.py",
    "trainer/test_host_syncs.py",
    "common/test_logprobs.py",
    "test_recipes.py",
    "test_registry.py",
    "test_layout.py",
    "cli/test_component_args.py",
    "cli/test_config_errors.py",
    "trainer/test_checkpoint_recovery.py",
    "orchestrator/test_packing.py",
    "orchestrator/test_batching.py",
    "orchestrator/test_schedules.py",
    "orchestrator/test_experts.py",
    "orchestrator/test_pools.py",
    "orchestrator/test_prompts.py",
    "inference/test_logits_processors.py",
    "inference/test_stream_text.py",
    "broadcast/test_cuda_ipc_codec.py",
    "broadcast/test_filesystem.py",
    "broadcast/test_filesystem_leftovers.py",
    "sweep/test_spec.py",
    "bench/test_overlap.py",
    "common/test_graph_capture.py",
    "cli/test_stages.py",
    "judges/test_template.py",
)


def pytest_collection_modifyitems(config, items):
    tests = Path(__file__).parent
    for item in items:
        relative = Path(item.fspath).relative_to(tests).as_posix()
        if any(relative == p or (p.endswith("/") and relative.startswith(p)) for p in UNIT_PATHS):
            item.add_marker(pytest.mark.unit)
