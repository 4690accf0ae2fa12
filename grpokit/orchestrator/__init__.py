"""The orchestrator: rollouts -> rewards -> advantages -> filters -> packed TrainingBatches."""

from grpokit.orchestrator.datamodule import Orchestrator

__all__ = ["Orchestrator"]
