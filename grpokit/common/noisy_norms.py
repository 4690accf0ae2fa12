"""QeRL noise on the inference copy's RMSNorm weights: pick the norms, noise a copy, load it into an engine.

QeRL (arXiv 2510.11696, Eq. 9-10) folds its per-channel noise vector into the scale of the RMSNorm that
feeds each block's linear layers, w_noise = w + Z, Z ~ N(0, sigma^2 I), so that for the layers after the
norm the noise is a row-wise multiplicative perturbation of their weights. The norms are every module
whose class name ends in "RMSNorm": in Llama/Qwen-style models input_layernorm and post_attention_layernorm
of each layer, q_norm/k_norm where the attention has them (Qwen3), and the final model.norm.

Rules this module keeps:
- Noise is added to the CLEAN weights of the current step, into new tensors: the trainer's parameters are
  never written, and noise never accumulates from one push to the next.
- The noise of a push is a function of (seed, step) only, drawn on the CPU in float32 in sorted name
  order, so a run (or a resumed run) reproduces it on any device.
- Names are those of the base model (a peft wrapper is looked through), e.g.
  `model.layers.0.input_layernorm.weight`, so the trainer's and the engine's models agree.

Shape legend: H hidden size (or head_dim for q/k norms).
"""

from __future__ import annotations

import torch

from grpokit.common.models import unwrap_peft

NOISE_SEED_MIX = 0x9E3779B97F4A7C15  # odd 64-bit constant: distinct (seed, step) pairs get distinct generator seeds


def norm_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weight of every RMSNorm module of `model` (base-model names), as the live parameters."""
    base = unwrap_peft(model)
    return {
        f"{name}.weight" if name else "weight": module.weight
        for name, module in base.named_modules()
        if type(module).__name__.endswith("RMSNorm") and isinstance(getattr(module, "weight", None), torch.Tensor)
    }


def noise_generator(seed: int, step: int) -> torch.Generator:
    """A CPU generator seeded from (seed, step) alone."""
    return torch.Generator().manual_seed((seed * NOISE_SEED_MIX + step) % (1 << 63))


@torch.no_grad()
def noisy_norms(clean: dict[str, torch.Tensor], sigma: float, seed: int, step: int) -> dict[str, torch.Tensor]:
    """New tensors w + N(0, sigma^2) for each clean weight w (on the CPU, in w's dtype); `clean` is not written.

    sigma = 0 returns exact copies of the clean weights, so an engine that was sent noisy norms earlier
    gets its clean values back.
    """
    g = noise_generator(seed, step)
    out = {}
    for name in sorted(clean):
        w_H = clean[name].detach().to("cpu", copy=True)
        if sigma > 0:
            z_H = torch.randn(w_H.shape, generator=g, dtype=torch.float32) * sigma
            w_H = (w_H.float() + z_H).to(w_H.dtype)  # in bf16, noise well below w's spacing (2^-8 w) rounds away
        out[name] = w_H
    return out


@torch.no_grad()
def apply_norm_weights(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Copy `tensors` (base-model names) into `model`'s parameters in place, converting dtype and device.

    The engine side of the noise: BuiltinEngine.load_weights calls it after loading the update's
    adapter or full weights; any engine holding a torch copy of the model can do the same.
    """
    params = dict(unwrap_peft(model).named_parameters())
    missing = sorted(set(tensors) - set(params))
    if missing:
        raise ValueError(
            "noisy norm weights name parameters the engine's model lacks: "
            f"{missing[:5]} (trainer and engine must load the same model.model)"
        )
    for name, t in tensors.items():
        if params[name].shape != t.shape:
            raise ValueError(
                f"noisy norm weight {name!r} has shape {tuple(t.shape)}, "
                f"the engine's parameter {tuple(params[name].shape)}"
            )
        params[name].copy_(t)


def check_engine_accepts_norms(engine, scheduler, broadcast=None) -> None:
    """Fail at start when noise is on and neither the engine nor the broadcast loads norm weights (e.g.
    vLLM's LoRA hot reload from the filesystem broadcast; VLLMNCCLBroadcast loads them in vLLM's worker)."""
    if (
        scheduler is None
        or not scheduler.enabled
        or getattr(engine, "applies_norm_weights", False)
        or getattr(broadcast, "applies_norm_weights", False)
    ):
        return
    raise ValueError(
        f"model.noise_scheduler ({type(scheduler).__name__}) is enabled, but inference: "
        f"{type(engine).__name__} cannot load the noisy norm weights it needs (vLLM's runtime LoRA "
        "loading takes adapter weights only). Use inference: BuiltinEngine (or grpokit infer), send the "
        "weights into vLLM's worker with broadcast: VLLMNCCLBroadcast, or set model.noise_scheduler: null"
    )
