"""`grpokit export`: a run's trained weights as a folder other tools load without grpokit.

    grpokit export outputs/my_run --out exported/adapter           # LoRA run: a peft adapter folder
    grpokit export outputs/my_run --out exported/merged --merge    # LoRA merged: a full HF model folder
    grpokit export outputs/full_run --step 40 --out exported/full  # full fine-tuning, step 40: a full folder

Where the weights come from, and why (grpokit.export.sources): the Lightning checkpoint
`checkpoints/step_N.ckpt` first, which holds exactly the trainer's trainable weights (the adapter, or
every weight of a full fine-tuning run; FSDP2 runs write it whole, a sharded folder is read too), and is
kept by `ckpt.keep_last`/`keep_interval`; else the filesystem broadcast's `broadcasts/step_N/` (STABLE),
the same trainer weights as published to the engine, kept only for the last few steps. Neither is the
engine's copy: QeRL's noise is added to the engine's RMSNorm weights only, and is written apart
(noisy_norms.safetensors) from the published weights, so no export carries it. The base model and the
LoRA settings come from the run's saved config.yaml (`model.model`, resolved like the trainer does, so
the built-in `smollm2-135m` works). A QLoRA run merges into its NF4 base dequantized (grpokit.export.model).

Modules: sources.py (the run folder: settings, steps, weight sources), model.py (the trainer's model
rebuilt, merged), folder.py (export_run: the folder, written atomically), command.py (the command line).
"""

from grpokit.export.folder import export_run

__all__ = ["export_run"]
