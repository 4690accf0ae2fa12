"""Memory and speed of LoRA in bf16 vs NF4 QLoRA vs 8-bit AdamW, on a Qwen3-0.6B-shaped model (no hub).

On a GPU:                python bench/gpu_qlora.py --out qlora.json
On CPU (smoke test):     python bench/gpu_qlora.py --device cpu --tiny --variants lora_bf16

A random-weight model with Qwen3-0.6B's shape (28 layers, hidden 1024, 16/8 heads, head_dim 128, vocab
151936, tied embeddings, q/k norms) is built from a transformers config and saved once to a temporary
folder; every variant loads it through grpokit's own loader (grpokit.common.models.load_causal_lm, NF4 via
grpokit.trainer.quantization) and optimizer (grpokit.trainer.quantization.build_optimizer), so the numbers are those of
the code `grpokit fit` runs. Each variant trains a few steps of next-token loss on one fixed random
batch (the loss falls when training works), one warm-up step first. Reported per variant: peak GPU memory
(torch.cuda.max_memory_allocated, reset before the variant loads), memory held by the loaded model,
trainable parameters, mean step time after warm-up and the loss per step. JSON on stdout; --out FILE
also writes it. A variant that cannot run (no bitsandbytes, paged optimizer on CPU) is reported with
its error instead of numbers.

Variants: lora_bf16 (bf16 base + LoRA, AdamW), qlora_nf4 (NF4 base + LoRA, AdamW), qlora_nf4_adamw_8bit,
full_bf16 (all weights, AdamW), full_bf16_adamw_8bit, full_bf16_paged_adamw_8bit.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from grpokit.common.models import load_causal_lm
from grpokit.trainer.quantization import build_optimizer, check_nf4, check_optimizer


@dataclass(frozen=True)
class Variant:
    name: str
    quantization: str | None
    lora: bool
    optimizer: str


VARIANTS = {
    v.name: v
    for v in (
        Variant("lora_bf16", None, True, "adamw"),
        Variant("qlora_nf4", "nf4", True, "adamw"),
        Variant("qlora_nf4_adamw_8bit", "nf4", True, "adamw_8bit"),
        Variant("full_bf16", None, False, "adamw"),
        Variant("full_bf16_adamw_8bit", None, False, "adamw_8bit"),
        Variant("full_bf16_paged_adamw_8bit", None, False, "paged_adamw_8bit"),
    )
}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    p.add_argument("--tiny", action="store_true", help="a 2-layer, hidden-64 model of the same family (CPU smoke test)")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, from: {', '.join(VARIANTS)}")
    p.add_argument("--steps", type=int, default=6, help="optimizer steps per variant, the first a warm-up")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    unknown = [v for v in args.variants.split(",") if v not in VARIANTS]
    if unknown:
        p.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    return args


def qwen3_config(tiny: bool):
    """Qwen3-0.6B's architecture (config.json of Qwen/Qwen3-0.6B), or a 2-layer miniature of it."""
    from transformers import Qwen3Config

    if tiny:
        return Qwen3Config(
            vocab_size=1024,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=32,
            max_position_embeddings=1024,
            tie_word_embeddings=True,
        )
    return Qwen3Config(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    )


def save_random_model(config, folder: Path) -> Path:
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(0)
    Qwen3ForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
    return folder


def build(variant: Variant, path: Path, device: torch.device, args: argparse.Namespace) -> torch.nn.Module:
    """The model as Policy.configure_model builds it: NF4 base via peft's k-bit preparation, LoRA on top."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if variant.quantization:
        check_nf4(device)
        lm = load_causal_lm(str(path), dtype=torch.bfloat16, quantization=variant.quantization, device=device)
        lm = prepare_model_for_kbit_training(lm, use_gradient_checkpointing=args.gradient_checkpointing)
    else:
        lm = load_causal_lm(str(path), dtype=torch.bfloat16).to(device)
        if args.gradient_checkpointing:
            lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if variant.lora:
        config = LoraConfig(
            r=args.lora_rank, lora_alpha=2 * args.lora_rank, target_modules=LORA_TARGETS, task_type="CAUSAL_LM"
        )
        lm = get_peft_model(lm, config)
        if args.gradient_checkpointing:
            lm.enable_input_require_grads()
    return lm.train()


def run_variant(variant: Variant, path: Path, vocab: int, device: torch.device, args: argparse.Namespace) -> dict:
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    check_optimizer(variant.optimizer, device)
    lm = build(variant, path, device, args)
    model_bytes = torch.cuda.memory_allocated(device) if cuda else None
    params = [p for p in lm.parameters() if p.requires_grad]
    opt = build_optimizer(variant.optimizer, params, lr=args.lr, betas=(0.9, 0.999), weight_decay=0.0)
    g = torch.Generator().manual_seed(0)
    ids_BT = torch.randint(0, vocab, (args.batch_size, args.seq_len), generator=g).to(device)
    losses, times = [], []
    for _ in range(args.steps):
        start = time.perf_counter()
        loss = lm(input_ids=ids_BT, labels=ids_BT).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
        losses.append(float(loss))
    result = {
        "variant": variant.name,
        "quantization": variant.quantization,
        "lora": variant.lora,
        "optimizer": variant.optimizer,
        "trainable_params": sum(p.numel() for p in params),
        "model_bytes": model_bytes,
        "peak_bytes": torch.cuda.max_memory_allocated(device) if cuda else None,
        "step_time_s": sum(times[1:]) / max(len(times) - 1, 1),
        "warmup_step_time_s": times[0],
        "losses": losses,
    }
    del lm, opt, params
    gc.collect()
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    config = qwen3_config(args.tiny)
    report = {
        "shape": "qwen3-tiny" if args.tiny else "qwen3-0.6b",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "batch_size": args.batch_size,
        "seq_len": args.seq_len,
        "lora_rank": args.lora_rank,
        "gradient_checkpointing": args.gradient_checkpointing,
        "results": [],
    }
    try:
        import bitsandbytes

        report["bitsandbytes"] = bitsandbytes.__version__
    except ImportError:
        report["bitsandbytes"] = None
    with tempfile.TemporaryDirectory(prefix="gpu_qlora.") as tmp:
        path = save_random_model(config, Path(tmp) / "model")
        for name in args.variants.split(","):
            try:
                report["results"].append(run_variant(VARIANTS[name], path, config.vocab_size, device, args))
            except (ImportError, RuntimeError) as e:  # the check's message says why and what to use instead
                report["results"].append({"variant": name, "error": str(e)})
            print(json.dumps(report["results"][-1]), file=sys.stderr)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if all("error" not in r for r in report["results"]) else 1


if __name__ == "__main__":
    sys.exit(main())
