"""grpokit: GRPO fine-tuning of language models from one YAML recipe. See README.md and docs/."""

from grpokit import moved

__version__ = "0.1.0"
moved.install()  # module paths from before the regrouping (old run folders' config.yaml) still import
