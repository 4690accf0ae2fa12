"""QLoRA's 4-bit NF4 base and bitsandbytes' 8-bit optimizers, with checks that fail at start.

`model.quantization: nf4` loads every linear layer of the base model as bitsandbytes 4-bit NormalFloat
(NF4, Dettmers et al. 2023) with bf16 compute, but the output head and a vision-language model's vision
tower and projector (grpokit.common.models.vision_skip_modules); peft's `prepare_model_for_kbit_training`
then casts the remaining weights (embeddings, norms, head) to float32 and LoRA trains on top. `model.optimizer` picks
torch's AdamW or bitsandbytes' AdamW8bit (block-wise 8-bit moments) / PagedAdamW8bit (moments in CUDA
unified memory, paged to the host under memory pressure).

bitsandbytes is optional (`pip install grpokit[qlora]`). Measured with bitsandbytes 0.50.2 on a CPU:
NF4 quantization, Linear4bit forward/backward and AdamW8bit all run; paged optimizers silently fall
back to unpaged ones (paging needs CUDA unified memory), so `paged_adamw_8bit` is refused off CUDA.
Each check runs a tiny real operation on the target device, so an install without a backend for that
device fails at start with the fix, not at the first step.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

QUANTIZATIONS = ("nf4",)
OPTIMIZERS = ("adamw", "adamw_8bit", "paged_adamw_8bit")
INSTALL_HINT = "install it with `pip install grpokit[qlora]` (bitsandbytes)"


def require_bitsandbytes(key: str, value: str):
    """Import bitsandbytes or raise ImportError naming the recipe key that needs it and the fix."""
    try:
        import bitsandbytes
    except ImportError as e:
        fallback = (
            "drop model.quantization (train the unquantized base)"
            if key == "model.quantization"
            else "use model.optimizer: adamw"
        )
        raise ImportError(
            f"{key}: {value} needs bitsandbytes, which is not installed: {INSTALL_HINT}, or {fallback}"
        ) from e
    return bitsandbytes


def validate_choice(key: str, value: str | None, choices: tuple[str, ...]) -> None:
    if value is not None and value not in choices:
        raise ValueError(f"{key} must be one of {', '.join(choices)}, got {value!r}")


def check_policy_settings(quantization: str | None, optimizer: str, has_lora: bool) -> None:
    """The Policy's checks at construction: known values, NF4 only under LoRA, bitsandbytes importable."""
    validate_choice("model.quantization", quantization, QUANTIZATIONS)
    validate_choice("model.optimizer", optimizer, OPTIMIZERS)
    if quantization is not None and not has_lora:
        raise ValueError(
            f"model.quantization: {quantization} needs model.lora: a 4-bit base is frozen, so QLoRA "
            "trains a LoRA adapter on it. Set model.lora, or drop model.quantization to train all weights"
        )
    if quantization is not None:
        require_bitsandbytes("model.quantization", quantization)
    if optimizer != "adamw":
        require_bitsandbytes("model.optimizer", optimizer)
    if optimizer.startswith("paged_") and not torch.cuda.is_available():
        check_optimizer(optimizer, "cpu")  # raises: paging needs CUDA (configure_optimizers checks the actual device)


def check_nf4(device: torch.device | str) -> None:
    """Quantize and dequantize a 64 x 64 block on `device`; raise RuntimeError with the fix if bitsandbytes cannot."""
    bnb = require_bitsandbytes("model.quantization", "nf4")
    from bitsandbytes.functional import dequantize_4bit, quantize_4bit

    try:
        w_RC = torch.randn(64, 64, generator=torch.Generator().manual_seed(0)).to(device, torch.bfloat16)
        packed, state = quantize_4bit(w_RC, quant_type="nf4")
        error = (dequantize_4bit(packed, state, quant_type="nf4").float() - w_RC.float()).abs().max().item()
        error /= w_RC.float().abs().max().item()
    except Exception as e:  # bitsandbytes raises RuntimeError, NotImplementedError or backend-specific errors
        raise RuntimeError(
            f"model.quantization: nf4 cannot run on {device}: bitsandbytes {bnb.__version__} has "
            f"no working 4-bit backend there ({e}). Run on a CUDA GPU, install a bitsandbytes "
            "release with a CPU backend (0.50.2 runs NF4 on CPU), or drop model.quantization"
        ) from e
    if not error < 0.2:  # NF4's widest level gap is 0.277 of a block's absmax: rounding errs by <= 0.14 of it
        raise RuntimeError(
            f"model.quantization: nf4 on {device}: bitsandbytes {bnb.__version__} round-trips "
            f"a test block with error {error:.3f} of its absmax; its backend is broken here"
        )


def check_optimizer(name: str, device: torch.device | str) -> None:
    """Raise, naming the fix, when `name` cannot run as asked on `device` (one real 8-bit step is taken)."""
    validate_choice("model.optimizer", name, OPTIMIZERS)
    if name == "adamw":
        return
    bnb = require_bitsandbytes("model.optimizer", name)
    if name.startswith("paged_") and torch.device(device).type != "cuda":
        raise RuntimeError(
            f"model.optimizer: {name} needs a CUDA device (paging moves optimizer state through CUDA unified memory; "
            f"on {device} bitsandbytes would silently run it unpaged): use model.optimizer: adamw_8bit"
        )
    try:
        p = torch.nn.Parameter(torch.randn(64, 64, device=device))  # 4096 elements: bitsandbytes' 8-bit threshold
        p.grad = torch.ones_like(p)
        opt = bnb.optim.AdamW8bit([p], lr=1e-3)
        opt.step()
    except Exception as e:
        raise RuntimeError(
            f"model.optimizer: {name} cannot run on {device}: bitsandbytes {bnb.__version__} "
            f"failed an 8-bit step ({e}). Use model.optimizer: adamw, or run on a CUDA GPU"
        ) from e


def build_optimizer(
    name: str,
    params: Iterable[torch.nn.Parameter] | list[dict],
    lr: float,
    betas: tuple[float, float],
    weight_decay: float,
) -> torch.optim.Optimizer:
    """AdamW (torch), AdamW8bit or PagedAdamW8bit (bitsandbytes) over `params` (parameters, or torch's
    parameter groups: dicts with "params" and their own settings, e.g. model.vision.lr)."""
    validate_choice("model.optimizer", name, OPTIMIZERS)
    params = list(params)
    if name == "adamw":
        flat = [p for g in params for p in g["params"]] if params and isinstance(params[0], dict) else params
        # one fused kernel per step on CUDA (plain tensors; FSDP2's DTensors keep foreach), foreach elsewhere
        fused = bool(flat) and all(p.device.type == "cuda" and type(p.data) is torch.Tensor for p in flat)
        return torch.optim.AdamW(
            params, lr=lr, betas=betas, weight_decay=weight_decay, **({"fused": True} if fused else {"foreach": True})
        )
    bnb = require_bitsandbytes("model.optimizer", name)
    cls = bnb.optim.AdamW8bit if name == "adamw_8bit" else bnb.optim.PagedAdamW8bit
    return cls(params, lr=lr, betas=betas, weight_decay=weight_decay)
