"""Sample a completion to an image prompt with the model's own `generate`, with per-token logprobs.

The reference the builtin engine's image path (grpokit.inference.image_rows) follows: token ids and, per
token, the logprob of the temperature-scaled distribution it was drawn from (grpokit.inference.sampler's
convention: log_softmax(logits / T), unscaled at T = 0; no top-k, top-p 1). The logprobs are taken from
`generate`'s raw logits (`output_logits`), so no logits processor of the model's generation config can
make them differ from what the trainer computes. An image placeholder token ends a completion and is
dropped from it (finish reason "image_token"): it has no pixels, so the trainer could not score it.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from grpokit.common.logprobs import at_least_float32
from grpokit.common.models import unwrap_peft
from grpokit.vision.logprobs import image_token_ids
from grpokit.vision.positions import mm_token_type_ids
from grpokit.vision.render import RenderedPrompt


@dataclass
class SampledCompletion:
    """A completion's token ids, their logprobs, and why it ended ("stop", "length" or "image_token")."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str


@torch.no_grad()
def sample_completion(
    model: torch.nn.Module,
    prompt: RenderedPrompt,
    max_tokens: int,
    temperature: float = 0.0,
    seed: int | None = None,
    stop_token_ids: tuple[int, ...] = (),
) -> SampledCompletion:
    """One completion to `prompt`: greedy at `temperature` 0, else drawn at `temperature` with the torch
    seed `seed` (the global RNG is restored afterwards). Stops on the model's EOS or `stop_token_ids`
    (kept in the completion) or after `max_tokens`."""
    from transformers import GenerationConfig

    lm = unwrap_peft(model)
    placeholders = image_token_ids(lm.config)
    eos = _eos_ids(lm) | set(stop_token_ids)
    drawn = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    config = GenerationConfig(
        max_new_tokens=max_tokens,
        **(drawn if temperature > 0 else {"do_sample": False}),
        eos_token_id=sorted(eos | placeholders),  # a placeholder stops generate; _finished drops it
        pad_token_id=min(eos | placeholders),  # one prompt: never used as padding
        output_logits=True,
        return_dict_in_generate=True,
    )
    ids_1P = torch.tensor([prompt.prompt_ids], device=_device(model))
    kwargs = {"input_ids": ids_1P, "attention_mask": torch.ones_like(ids_1P)}
    kwargs.update(prompt.vision.model_kwargs(ids_1P.device, next(model.parameters()).dtype))
    if "mm_token_type_ids" in inspect.signature(lm.forward).parameters:
        kwargs["mm_token_type_ids"] = mm_token_type_ids(lm.config, ids_1P)  # the Qwen-VL family's 3-D positions
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        out = model.generate(**kwargs, generation_config=config)
    tokens_C = out.sequences[0, ids_1P.shape[1] :]
    logits_CV = at_least_float32(torch.stack(out.logits, 1)[0])
    scaled_CV = logits_CV / temperature if temperature > 0 else logits_CV
    logprobs_C = torch.log_softmax(scaled_CV, -1).gather(-1, tokens_C[:, None]).squeeze(-1)
    return _finished(tokens_C.tolist(), logprobs_C.tolist(), eos, placeholders)


def _finished(tokens: list[int], logprobs: list[float], eos: set[int], placeholders: set[int]) -> SampledCompletion:
    """The completion cut at its first stop: an image placeholder is dropped, an EOS kept."""
    for i, token in enumerate(tokens):
        if token in placeholders:
            return SampledCompletion(tokens[:i], logprobs[:i], "image_token")
        if token in eos:
            return SampledCompletion(tokens[: i + 1], logprobs[: i + 1], "stop")
    return SampledCompletion(tokens, logprobs, "length")


def _eos_ids(lm: torch.nn.Module) -> set[int]:
    eos = getattr(lm.generation_config, "eos_token_id", None)
    if eos is None:
        eos = getattr(getattr(lm.config, "text_config", lm.config), "eos_token_id", None)
    return set(eos if isinstance(eos, list) else [eos] if eos is not None else [])


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device
