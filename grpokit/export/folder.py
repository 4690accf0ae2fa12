"""`export_run`: one step of a run written as a folder that plain transformers, peft or vLLM loads.

- LoRA run, default: a peft adapter folder (adapter_config.json, adapter_model.safetensors) for
  `PeftModel.from_pretrained(base, DIR)`, plus the tokenizer (with its chat template).
- LoRA run, `merge=True`: the adapter merged into the base (peft's `merge_and_unload`), saved as a full
  Hugging Face model folder (config.json, generation_config.json, model.safetensors, tokenizer) for
  `AutoModelForCausalLM.from_pretrained(DIR)` or vLLM, with no grpokit installed.
- Full fine-tuning run: the same full model folder, always (there is no adapter to keep apart, so
  `merge=True` is refused as a mistake rather than ignored).

The folder is built in a temp sibling and renamed into place at the end (grpokit.common.io.atomic_folder):
a crash leaves no half-written export, and `force` replaces an earlier export only once the new one is whole.
"""

from __future__ import annotations

import logging
from pathlib import Path

from grpokit.common.io import atomic_folder
from grpokit.common.models import parse_dtype
from grpokit.export.model import merged_model, trained_model
from grpokit.export.sources import RunSettings, pick_source
from grpokit.vision.render import save_tokenizer

log = logging.getLogger(__name__)


def export_run(
    run_dir: str | Path,
    out: str | Path,
    step: int | None = None,
    merge: bool = False,
    force: bool = False,
    dtype: str | None = None,
) -> Path:
    """Write step `step` (None: the newest) of the run in `run_dir` to the folder `out`; returns `out`.

    Args:
        run_dir: the run folder (output_dir/run_name), holding config.yaml and checkpoints/ or broadcasts/.
        out: the export folder; it must not exist or be empty, unless `force` (then it is replaced).
        step: the step to export (checkpoints first, then broadcast folders; grpokit.export.sources).
        merge: a LoRA run's adapter merged into its base, as a full model folder.
        force: replace a non-empty `out`.
        dtype: float32, bfloat16 or float16 for a full model folder (refused for an adapter folder, which
            keeps the trainer's dtype); None = the run's model.dtype.
    """
    run_dir, out = Path(run_dir), Path(out)
    settings = RunSettings.read(run_dir)
    check_out(out, run_dir, force)
    if merge and settings.lora is None:
        raise ValueError(
            f"--merge: {run_dir} is a full fine-tuning run (model.lora: null), so there is no adapter to merge; "
            "drop --merge: its export is a full model folder as it is"
        )
    full = merge or settings.lora is None
    if dtype is not None and not full:
        raise ValueError(
            f"--dtype {dtype}: an adapter folder keeps the trainer's dtype ({settings.dtype}); --dtype sets a full "
            "model folder's: add --merge, or drop --dtype"
        )
    torch_dtype = parse_dtype(dtype or settings.dtype)
    source = pick_source(run_dir, step)
    lm = trained_model(settings, source, base_weights=full)
    if merge:
        lm = merged_model(lm)
    with atomic_folder(out) as tmp:
        if full:
            lm.to(torch_dtype).save_pretrained(tmp, safe_serialization=True)
        else:
            lm.save_pretrained(tmp)
        save_tokenizer(settings.model, tmp)
    log.info("exported step %d of %s (from %s) to %s", source.step, run_dir, source.path, out)
    return out


def check_out(out: Path, run_dir: Path, force: bool) -> None:
    """Refuse an export folder that is a file, holds files (unless `force`), or is or holds the run."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder: choose a folder path")
    resolved, run = out.resolve(), run_dir.resolve()
    if resolved == run or resolved in run.parents:
        raise ValueError(f"--out {out} is or contains the run folder {run_dir}: choose a folder outside it")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ValueError(
            f"--out {out} is not empty: choose a new folder, or pass --force to replace its contents with the export"
        )
