"""grpokit: GRPO fine-tuning of language models from one YAML recipe. See README.md and docs/."""

__version__ = "0.1.0"
