"""The builtin engine's plain path for a prompt with images: one group at a time, with the plain sampler.

A group whose prompt holds images (GroupRequest.vision, grpokit.vision.inputs.VisionInputs) is not
admitted into the continuous batch (grpokit.inference.decode_stream) nor onto the fast path: their
rows keep per-row positions and caches that an image prompt's model inputs would not follow (the
Qwen-VL family's 3-D rotary positions). Instead its prompt is prefilled once, on its own, with its image
inputs and the model's own positions (grpokit.vision.positions, as the trainer scores it), the KV cache
copied to its n rows, and the rows decoded by grpokit.inference.sampler.decode_rows with the engine's
settings: the same processed logits, draws and logprob convention as every text prompt. A decoded
token's position is the last prompt position plus its offset (the Qwen-VL family continues text after
images from the largest position, all three axes alike), which a 2-D position id gives.

An image placeholder token ends a completion and is dropped from it (it has no pixels, so the trainer
could not score it); the completion counts as stopped (grpokit.vision.sample does the same).

Shape legend: B rows (the group's n), P prompt tokens, V vocabulary.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from grpokit.common.models import unwrap_peft
from grpokit.inference import Completion, SamplingSettings, ServingOptions
from grpokit.inference.sampler import cache_kwarg, decode_rows
from grpokit.vision.inputs import VisionInputs
from grpokit.vision.logprobs import image_token_ids
from grpokit.vision.positions import packed_position_ids

SEED_STRIDE = 1_000_003  # a group's generator: its request's seed times this plus its number in the stream


@torch.no_grad()
def image_prefill(model: torch.nn.Module, prompt_ids: list[int], vision: VisionInputs, n: int):
    """`sampler.prefill`'s (input_ids_BP, mask_BP, positions_BP, KV cache, logits_BV) for n rows of one
    prompt with images: one forward with the image inputs, its cache copied to the n rows. positions_BP
    holds each prompt token's largest position (the last is where decoding continues from)."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    ids_P = torch.tensor(prompt_ids, device=device)
    positions = packed_position_ids(model, ids_P, torch.tensor([len(prompt_ids)], device=device), vision)
    mask_1P = torch.ones((1, len(prompt_ids)), dtype=torch.long, device=device)
    cache = DynamicCache()
    logits_1V = model(
        input_ids=ids_P[None],
        attention_mask=mask_1P,
        position_ids=positions.unsqueeze(-2),  # [1, P], or the Qwen-VL family's [3, 1, P]
        **vision.model_kwargs(device, dtype),
        **cache_kwarg(model, cache),
        use_cache=True,
        logits_to_keep=1,
    ).logits[:, -1]
    rows_B = torch.zeros(n, dtype=torch.long, device=device)
    cache.reorder_cache(rows_B)  # the prompt's keys and values for each of its rows
    last_P = positions if positions.ndim == 1 else positions.max(0).values
    return ids_P.expand(n, -1), mask_1P.expand(n, -1), last_P.expand(n, -1), cache, logits_1V[rows_B]


def sample_image_group(
    engine, request, sampling: SamplingSettings, generator: torch.Generator, cancelled=None
) -> list[Completion]:
    """The n completions of `request` (a GroupRequest with vision) on `engine`'s model (a BuiltinEngine,
    plain path; its merged LoRA weights active when it has them). `cancelled`: a threading.Event that
    stops the decode between steps (a server's request whose client has gone)."""
    model = engine.model
    placeholders = image_token_ids(unwrap_peft(model).config)
    sampling = replace(sampling, max_tokens=request.max_tokens or sampling.max_tokens)
    stop = engine._stop_token_ids(sampling) | placeholders
    prefilled = image_prefill(model, request.prompt_ids, request.vision, request.n)
    options = ServingOptions(cancelled=cancelled) if cancelled is not None else None
    rows = decode_rows(
        model, [request.prompt_ids] * request.n, prefilled, sampling, stop, generator, engine.tokenizer.decode, options
    )
    completions = []
    for row in rows:
        tokens, logprobs = row.token_ids, row.logprobs
        if tokens and tokens[-1] in placeholders:  # a placeholder ends the completion and is dropped
            tokens, logprobs = tokens[:-1], logprobs[:-1]
        completions.append(Completion(tokens, logprobs, not row.done, engine.weight_step))
    return completions
