"""How far repetition_penalty and min_tokens move the engine's logprobs from the trainer's.

The builtin engine reports logprobs of the distribution it sampled from (stop tokens masked before
min_tokens, repetition penalty, temperature); the trainer recomputes the temperature-scaled model
distribution only. This samples reverse-text prompts with SmolLM2-135M-Instruct under several settings
and prints the per-token mismatch the loss's importance ratio will see (grpokit.trainer.metrics.mismatch_metrics)
and the fraction of tokens outside AIPO's default token mask [0.125, 8].

    python bench/sampling_mismatch.py [--model smollm2-135m] [--prompts 8] [--n 4] [--max_tokens 64]
"""

from __future__ import annotations

import argparse

import torch

from grpokit.common.logprobs import packed_token_logprobs
from grpokit.environments.environment import Environment, EnvSpec
from grpokit.inference import SamplingSettings
from grpokit.inference.builtin import BuiltinEngine
from grpokit.trainer.metrics import mismatch_metrics

SETTINGS = [
    {"repetition_penalty": 1.0},
    {"repetition_penalty": 1.05},
    {"repetition_penalty": 1.1},
    {"repetition_penalty": 1.2},
    {"min_tokens": 16},
]


def measure(engine: BuiltinEngine, prompts: list[list[int]], n: int, sampling: SamplingSettings) -> dict[str, float]:
    trainer, infer = [], []
    for prompt, group in zip(prompts, engine.generate(prompts, n, sampling)):
        for c in group:
            ids = torch.tensor(prompt + c.token_ids)
            with torch.no_grad():
                lp_T = packed_token_logprobs(
                    engine.model, ids, torch.arange(len(ids)), torch.tensor([len(ids)]), sampling.temperature
                )
            trainer.append(lp_T[len(prompt) :].double())
            infer.append(torch.tensor(c.logprobs, dtype=torch.float64))
    trainer_T, infer_T = torch.cat(trainer), torch.cat(infer)
    metrics = {k: float(v) for k, v in mismatch_metrics(trainer_T, infer_T, torch.ones_like(trainer_T)).items()}
    ratio_T = torch.exp(trainer_T - infer_T)
    metrics["masked_by_aipo"] = float(((ratio_T < 0.125) | (ratio_T > 8.0)).double().mean())
    metrics["tokens"] = float(len(trainer_T))
    return metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max_tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args()
    engine = BuiltinEngine(device="cpu")
    engine.setup(args.model)
    env = Environment(EnvSpec(id="reverse-text"))
    prompts = [
        engine.tokenizer.apply_chat_template(ex.messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        for ex in env.examples[: args.prompts]
    ]
    print(
        "| setting | tokens | gen_kl_error | token_mult_prob_error "
        "| sampling_importance_ratio | masked by AIPO [0.125, 8] |"
    )
    print("|---|---|---|---|---|---|")
    for extra in SETTINGS:
        sampling = SamplingSettings(temperature=args.temperature, max_tokens=args.max_tokens, seed=0, **extra)
        m = measure(engine, prompts, args.n, sampling)
        name = ", ".join(f"{k}={v}" for k, v in extra.items())
        print(
            f"| {name} | {m['tokens']:.0f} | {m['gen_kl_error']:.4f} | {m['token_mult_prob_error']:.3f} "
            f"| {m['sampling_importance_ratio']:.3f} | {m['masked_by_aipo']:.4f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
