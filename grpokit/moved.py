"""Module paths from before the package was regrouped by role (2026-11-25), still importable.

Runs and sweeps wrote class paths into their config.yaml / resolved.yaml (the CSV logger, callbacks, the
vLLM engine), and plug-ins import helpers such as `grpokit.models`: an old path imports the module at
its new place (the same module object), so an old run folder resumes and an old plug-in loads. New code
uses the new paths (a test checks that grpokit itself never imports an old one).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

MOVED = {
    "grpokit.bench.cli": "grpokit.bench.command",
    "grpokit.callbacks": "grpokit.trainer.callbacks",
    "grpokit.checkpoint": "grpokit.trainer.checkpoint",
    "grpokit.checksums": "grpokit.common.checksums",
    "grpokit.cli_errors": "grpokit.cli.errors",
    "grpokit.component_args": "grpokit.cli.component_args",
    "grpokit.components": "grpokit.cli.discovery",
    "grpokit.distributed": "grpokit.trainer.distributed",
    "grpokit.env": "grpokit.orchestrator.environment",
    "grpokit.fsdp": "grpokit.trainer.fsdp",
    "grpokit.guards": "grpokit.trainer.guards",
    "grpokit.inference.requests": "grpokit.inference.server.requests",
    "grpokit.inference.vllm_launch": "grpokit.inference.vllm.launch",
    "grpokit.inference.vllm_server": "grpokit.inference.vllm.server",
    "grpokit.inference.vllm_worker": "grpokit.inference.vllm.worker",
    "grpokit.io": "grpokit.common.io",
    "grpokit.loggers": "grpokit.trainer.loggers",
    "grpokit.logprobs": "grpokit.trainer.logprobs",
    "grpokit.lora": "grpokit.trainer.lora",
    "grpokit.lr_schedule": "grpokit.trainer.lr_schedule",
    "grpokit.memory": "grpokit.inference.vllm.memory",
    "grpokit.metrics": "grpokit.trainer.metrics",
    "grpokit.models": "grpokit.common.models",
    "grpokit.norm_noise": "grpokit.common.noisy_norms",
    "grpokit.policy": "grpokit.trainer.policy",
    "grpokit.prefix_tree": "grpokit.common.prefix_tree",
    "grpokit.progress": "grpokit.trainer.progress",
    "grpokit.quantization": "grpokit.trainer.quantization",
    "grpokit.recipe_files": "grpokit.cli.recipe_files",
    "grpokit.roles": "grpokit.cli.roles",
    "grpokit.teacher": "grpokit.trainer.teacher",
    "grpokit.timeline": "grpokit.common.timeline",
    "grpokit.varlen": "grpokit.trainer.varlen",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old module name of MOVED and loads it as the module at its new name."""

    def find_spec(self, name, path=None, target=None):
        if name not in MOVED:
            return None
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec):
        module = importlib.import_module(MOVED[spec.name])
        self.own_spec = module.__spec__  # the import system is about to set the alias's spec on it
        return module

    def exec_module(self, module) -> None:
        module.__spec__ = self.own_spec  # give the module back its own spec (its real name)


def install() -> None:
    """Let the old module paths import (once per process)."""
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.append(_Alias())
