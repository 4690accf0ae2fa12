"""Trainer-side per-token logprobs of a (packed) row of sequences with images, and its loss mask.

Packing is the text path's (grpokit.common.logprobs.packed_token_logprobs): position ids restart per
sequence (here the model's own, grpokit.vision.positions) and attention is kept inside each sequence,
by cumulative lengths when the model is on grpokit's varlen backend (grpokit.common.varlen), else by
the dense [T, T] block-diagonal mask (grpokit.common.logprobs.packed_attention_mask), which the
Qwen-VL and Idefics3 text models take on CPU/SDPA as they are: their mask builder keeps a 4-D mask it
is given. The vision tower sees each image on its own in both families, so images need no mask.
Departures from the text path, for the next slice to fold in: full [T, vocab] logits (no chunked head,
no `needed_T`), no prefix sharing.
"""

from __future__ import annotations

import torch

from grpokit.common.logprobs import packed_attention_mask, selective_logprobs
from grpokit.common.models import unwrap_peft
from grpokit.common.varlen import NAME as VARLEN
from grpokit.common.varlen import register
from grpokit.vision.inputs import VisionInputs
from grpokit.vision.positions import packed_position_ids


def image_token_ids(config) -> set[int]:
    """The placeholder token ids of a vision-language model's config (image, and video where it has one)."""
    names = ("image_token_id", "video_token_id", "image_token_index")
    return {int(getattr(config, n)) for n in names if getattr(config, n, None) is not None}


def completion_loss_mask(
    input_ids_T: torch.Tensor, seq_lens_N: torch.Tensor, prompt_lens_N: torch.Tensor, placeholder_ids: set[int]
) -> torch.Tensor:
    """[T] bool: True on each sequence's completion tokens (those after its first `prompt_lens_N` tokens),
    never on a prompt token or an image placeholder."""
    offsets_N = torch.cumsum(seq_lens_N, 0) - seq_lens_N
    index_T = torch.arange(input_ids_T.shape[0], device=input_ids_T.device)
    seq_T = torch.repeat_interleave(torch.arange(len(seq_lens_N), device=input_ids_T.device), seq_lens_N)
    in_completion_T = index_T - offsets_N[seq_T] >= prompt_lens_N[seq_T]
    placeholder_T = torch.isin(input_ids_T, torch.tensor(sorted(placeholder_ids), device=input_ids_T.device))
    return in_completion_T & ~placeholder_T


def packed_vision_logprobs(
    model: torch.nn.Module,
    input_ids_T: torch.Tensor,
    seq_lens_N: torch.Tensor,
    vision: VisionInputs,
    temperature: float = 1.0,
) -> torch.Tensor:
    """[T] logprob of input_ids[t] given the tokens (and images) before it in its own sequence; 0 at each
    sequence's first token. Logits are divided by `temperature` (> 0; 0 = greedy, scored unscaled, as the
    engines report it), so the values match the engine's sampling distribution."""
    lm = unwrap_peft(model)
    device, dtype = input_ids_T.device, next(model.parameters()).dtype
    positions = packed_position_ids(model, input_ids_T, seq_lens_N, vision)  # [T] or [3, T]
    inputs = {
        "input_ids": input_ids_T[None],
        "position_ids": positions.unsqueeze(-2),  # [1, T] or [3, 1, T]
        "use_cache": False,
        **vision.model_kwargs(device, dtype),
        **_attention(lm, seq_lens_N.to(device), dtype),
    }
    starts_T = torch.zeros_like(input_ids_T, dtype=torch.bool)
    starts_T[(torch.cumsum(seq_lens_N, 0) - seq_lens_N).to(device)] = True
    keep_K = (~starts_T[1:]).nonzero().squeeze(-1)  # position p predicts token p + 1
    logits_KV = model(**inputs).logits[0].index_select(0, keep_K)
    scaled_KV = logits_KV / temperature if temperature > 0 else logits_KV
    logprobs_K = selective_logprobs(scaled_KV, input_ids_T[keep_K + 1])
    return logprobs_K.new_zeros(input_ids_T.shape[0]).index_put((keep_K + 1,), logprobs_K)


def use_varlen_text(model: torch.nn.Module) -> None:
    """Switch the text model of vision-language `model` to grpokit's varlen backend, and only it.

    grpokit.common.varlen.use_varlen switches every sub-model, and the vision towers then fail: their
    attention gets no packed-sequence boundaries (nor needs them: each image is attended on its own).
    """
    register()
    unwrap_peft(model).set_attn_implementation({"text_config": VARLEN})


def _attention(lm: torch.nn.Module, seq_lens_N: torch.Tensor, dtype: torch.dtype) -> dict:
    """The keyword arguments that keep attention inside each sequence (see the module docstring)."""
    text_config = getattr(lm.config, "text_config", lm.config)
    if getattr(text_config, "_attn_implementation", None) == VARLEN:
        cu_N1 = torch.cat([seq_lens_N.new_zeros(1), seq_lens_N.cumsum(0)]).to(torch.int32)
        max_len = int(seq_lens_N.max())
        return {"cu_seq_lens_q": cu_N1, "cu_seq_lens_k": cu_N1, "max_length_q": max_len, "max_length_k": max_len}
    return {"attention_mask": packed_attention_mask(seq_lens_N, dtype)}
