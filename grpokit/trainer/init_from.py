"""`model.init_from`: start `grpokit fit` (GRPO) from the weights a `grpokit sft` run left.

A finished SFT run writes `RUN/model/` (grpokit.trainer.sft.SaveSFTModel): a full model folder with
the final weights (a LoRA adapter merged into the base), the tokenizer, and grpokit_sft.json naming the
base. Naming the run folder makes that folder the policy's starting weights, and so also the engine's
first weights and the initial policy that reference terms (KL, data.kl_in_reward) compare against: the
SFT model, as in the usual SFT -> RL pipeline. `model.lora` adds a fresh adapter on top of it.
"""

from __future__ import annotations

import json
from pathlib import Path

SFT_MARKER = "grpokit_sft.json"


def sft_model(run_dir: str, model: str) -> str:
    """The model folder of the SFT run `run_dir`, refused unless the run finished and was fine-tuned
    from `model` (model.model), whose tokenizer rollouts and rewards are computed with."""
    folder = Path(run_dir).expanduser() / "model"
    marker = folder / SFT_MARKER
    if not marker.is_file():
        raise FileNotFoundError(
            f"model.init_from {run_dir!r}: no {marker}: not a finished `grpokit sft` run (it writes model/ when "
            "it reaches trainer.max_steps; resume an unfinished one with --ckpt.resume_step -1). Set "
            "model.init_from to the SFT run's folder, output_dir/run_name"
        )
    base = json.loads(marker.read_text())["base_model"]
    if base != model:
        raise ValueError(
            f"model.init_from {run_dir!r} was fine-tuned from {base!r}, but model.model is {model!r}: set "
            f"model.model: {base} (the SFT run's tokenizer and base), or start from another SFT run"
        )
    return str(folder)
