"""Per-token log-probabilities of packed sequences.

Packing puts several sequences in one row; position_ids restart at 0 for each, and a block-diagonal
causal mask keeps a token from attending to the sequence packed before it (transformers' sdpa and
eager paths do not infer that from position_ids alone: measured, the logits differ otherwise).
"""

from __future__ import annotations

import contextlib
import inspect

import torch

from grpokit.common.models import compute_dtype, unwrap_peft
from grpokit.common.prefix_tree import prefix_tree
from grpokit.common.varlen import NAME as VARLEN
from grpokit.types import PrefixTree
from grpokit.vision.inputs import VisionInputs
from grpokit.vision.positions import packed_position_ids


def packed_attention_mask(seq_lens_N: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive [1, 1, T, T] mask: 0 where token q may attend to token k (same sequence, k <= q)."""
    seq_ids_T = torch.repeat_interleave(torch.arange(len(seq_lens_N), device=seq_lens_N.device), seq_lens_N)
    t = seq_ids_T.numel()
    allowed = torch.ones(t, t, dtype=torch.bool, device=seq_lens_N.device).tril_() & (
        seq_ids_T[:, None] == seq_ids_T[None, :]
    )
    mask = torch.zeros(t, t, dtype=dtype, device=seq_lens_N.device).masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """`x` in float32 (logprobs of bf16 logits are taken in float32), or as it is in float64: a float64
    model keeps its precision, so tests compare packed and separate paths to float64 rounding."""
    return x if x.dtype == torch.float64 else x.float()


def selective_logprobs(logits_TV: torch.Tensor, targets_T: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] per row, in float32 (float64 for float64 logits).

    torch's fused log_softmax, then a gather: on the CPU it is ~8x faster than logsumexp, whose
    forward and backward run as separate max / sub / exp / sum passes over [T, vocab] (measured on
    SmolLM2's 49k vocabulary: 0.12 s against ~1 s per 1,000 tokens, forward and backward). Its output
    replaces the logits in memory (the head's backward does not keep them).
    """
    return torch.log_softmax(at_least_float32(logits_TV), -1).gather(-1, targets_T[:, None]).squeeze(-1)


def _chunk_logprobs(lm_head, hidden_CH, targets_C, temperature: float, with_entropy: bool):
    logits_CV = at_least_float32(lm_head(hidden_CH)) / temperature
    lse_C = torch.logsumexp(logits_CV, dim=-1)
    picked_C = logits_CV.gather(-1, targets_C[:, None]).squeeze(-1) - lse_C
    if not with_entropy:
        return picked_C
    return picked_C, lse_C - (torch.softmax(logits_CV, -1) * logits_CV).sum(-1)


_COMPILED = None


def _compiled_chunk_logprobs():
    """_chunk_logprobs under torch.compile: the float cast, scaling, logsumexp and gather fused."""
    global _COMPILED
    if _COMPILED is None:
        _COMPILED = torch.compile(_chunk_logprobs, dynamic=True)
    return _COMPILED


def chunked_logprobs(
    lm_head: torch.nn.Module,
    hidden_TH: torch.Tensor,
    targets_T: torch.Tensor,
    temperature: float,
    chunk_size: int,
    with_entropy: bool = False,
    compile: bool = False,
):
    """log softmax(lm_head(hidden_t) / temperature)[target_t] per row, `chunk_size` rows at a time.

    Each chunk runs under activation checkpointing, so neither the forward nor the backward ever holds
    more than one [chunk_size, vocab] float32 logits tensor (the full one is tokens x vocab x 4 bytes:
    5 GB for 8,192 tokens of a 152k vocabulary). Backward recomputes each chunk's logits once.
    `compile` (CUDA only) fuses the per-chunk elementwise passes over [chunk, vocab] with torch.compile.
    """
    from torch.utils.checkpoint import checkpoint

    fn = _compiled_chunk_logprobs() if hidden_TH.is_cuda and compile else _chunk_logprobs
    parts = [
        checkpoint(
            fn,
            lm_head,
            hidden_TH[i : i + chunk_size],
            targets_T[i : i + chunk_size],
            temperature,
            with_entropy,
            use_reentrant=False,
        )
        for i in range(0, max(hidden_TH.shape[0], 1), chunk_size)  # no rows: one empty chunk keeps the graph
    ]
    if not with_entropy:
        return torch.cat(parts)
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def _supports_chunking(lm: torch.nn.Module) -> bool:
    """The causal LM's logits are exactly lm_head(final hidden state): no softcapping or logit scaling."""
    config = lm.config
    return (
        hasattr(lm, "model")
        and lm.get_output_embeddings() is not None
        and not getattr(config, "final_logit_softcapping", None)
        and getattr(config, "logit_scale", None) in (None, 1.0)
        and getattr(config, "logits_scaling", None) in (None, 1.0)
    )


def _keeps_positions(lm: torch.nn.Module) -> bool:
    """The model's forward takes `logits_to_keep` (every transformers 5 causal LM does)."""
    return "logits_to_keep" in inspect.signature(lm.forward).parameters


class _LogprobHead(torch.nn.Module):
    """Stands in for the LM head for one forward: returns the targets' log-probabilities (and entropies)
    computed chunk by chunk from the head's input, [1, K] (or [1, K, 2]), instead of [1, K, vocab] logits.

    Swapping it in, rather than calling the decoder and the head separately, keeps the whole computation
    inside the root module's forward, where FSDP2 has gathered the head's (sharded) weight.
    """

    def __init__(
        self,
        head: torch.nn.Module,
        targets_K: torch.Tensor,
        temperature: float,
        chunk_size: int,
        with_entropy: bool,
        compile: bool,
    ):
        super().__init__()
        self.head, self.targets_K = head, targets_K
        self.temperature, self.chunk_size, self.with_entropy, self.compile = (
            temperature,
            chunk_size,
            with_entropy,
            compile,
        )

    def forward(self, hidden_1KH: torch.Tensor) -> torch.Tensor:
        out = chunked_logprobs(
            self.head, hidden_1KH[0], self.targets_K, self.temperature, self.chunk_size, self.with_entropy, self.compile
        )
        return (torch.stack(out, -1) if self.with_entropy else out)[None]


class _RowsThenHead(torch.nn.Module):
    """The head applied to the hidden states at `rows_K` only, picked with `index_select`.

    transformers' own `logits_to_keep=rows` picks them with advanced indexing, whose backward on the CPU
    adds repeated rows (a shared prefix tree node predicts one token per sequence that shares it) with
    parallel atomic adds: with more than one thread the gradient's last bits then change from run to
    run. `index_select`'s backward (`index_add`) sums them in a fixed order, so training reproduces at
    any thread count (the same values either way; tests/common/test_logprobs.py).
    """

    def __init__(self, head: torch.nn.Module, rows_K: torch.Tensor):
        super().__init__()
        self.head, self.rows_K = head, rows_K

    def forward(self, hidden_1TH: torch.Tensor) -> torch.Tensor:
        return self.head(hidden_1TH.index_select(1, self.rows_K.to(hidden_1TH.device)))


@contextlib.contextmanager
def _head_replaced(lm: torch.nn.Module, head: torch.nn.Module):
    """`lm`'s output-embedding child module replaced by `head` inside the block."""
    original = lm.get_output_embeddings()
    name = next(n for n, m in lm.named_children() if m is original)
    setattr(lm, name, head)
    try:
        yield
    finally:
        setattr(lm, name, original)


def packed_token_logprobs(
    model: torch.nn.Module,
    input_ids_T: torch.Tensor,
    position_ids_T: torch.Tensor,
    seq_lens_N: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_size: int = 0,
    compile: bool = False,
    needed_T: torch.Tensor | None = None,
    share_prefixes: bool = False,
    tree: PrefixTree | None = None,
    vision: VisionInputs | None = None,
):
    """logprob of input_ids[t] given the tokens before it in its own sequence (0 at a sequence's first token).

    Logits are divided by `temperature` so the result matches the engine's sampling distribution. With
    `with_entropy`, also returns the entropy of each token's predictive distribution (same alignment;
    0 at sequence starts): H = logsumexp(l) - sum softmax(l) * l.

    Attention: with the model on grpokit's varlen backend (grpokit.common.varlen.use_varlen), sequences are
    separated by cumulative lengths; otherwise by a dense [T, T] block-diagonal mask.
    Which tokens: `needed_T` (bool or 0/1, [T]) names the tokens whose logprob is wanted, e.g. the loss
    mask; the LM head and the softmax run only on the positions that predict them (transformers'
    `logits_to_keep`), and every other token gets 0. Prompt tokens are most of a short-answer batch,
    and the head is a fifth of a small model's compute. None = every token.
    Memory: `chunk_size` > 0 computes logits from the final hidden states `chunk_size` tokens at a time
    (grpokit.common.logprobs.chunked_logprobs); 0 materialises the full [tokens, vocab] float32 logits (and one
    more such tensor for the entropy), kept for backward. `compile` fuses each chunk's passes (CUDA).
    The whole computation runs inside the model's own forward, so it works on FSDP2-sharded models.
    Prefixes: `share_prefixes` runs the model once per distinct prefix of the packed sequences (a GRPO
    micro-batch repeats each prompt G times; grpokit.common.prefix_tree), with the same values and gradients;
    it needs the dense attention path. `tree` is the packed row's prefix tree when the caller has it
    (MicroBatch.prefix_tree); without it, it is built here.
    Images: `vision` (MicroBatch.vision) is the row's image inputs, passed to the model's forward, which
    then runs with the model's own positions of each sequence (grpokit.vision.positions: the Qwen-VL
    family's 3-D ones); `position_ids_T` still says where each sequence starts. Not with `share_prefixes`.
    """

    lm = unwrap_peft(model)
    device = input_ids_T.device
    seq_lens_N = seq_lens_N.to(device)
    dtype = compute_dtype(model)
    model_ids, model_positions, row_T = (
        input_ids_T,
        position_ids_T,
        None,
    )  # row_T: each token's row in the model's input
    if vision and share_prefixes:
        raise ValueError("a micro-batch with images is never scored by prefix tree: call with share_prefixes off")
    if _text_attention(lm) == VARLEN:
        if share_prefixes:
            raise ValueError(
                "model.share_prefixes needs dense attention (a tree mask); "
                "set model.attention: dense or model.share_prefixes: false"
            )
        cu_N1 = torch.cat([seq_lens_N.new_zeros(1), seq_lens_N.cumsum(0)]).to(torch.int32)
        max_len = int(seq_lens_N.max())
        kwargs = {"cu_seq_lens_q": cu_N1, "cu_seq_lens_k": cu_N1, "max_length_q": max_len, "max_length_k": max_len}
    elif share_prefixes:
        tree = tree if tree is not None else prefix_tree(input_ids_T, position_ids_T, seq_lens_N)
        model_ids, model_positions, row_T = tree.input_ids_U, tree.position_ids_U, tree.node_T
        kwargs = {"attention_mask": tree.attention_mask(dtype)}
    else:
        kwargs = {"attention_mask": packed_attention_mask(seq_lens_N, dtype)}
    wanted_T = position_ids_T.to(device) != 0  # a sequence's first token has no prediction
    if needed_T is not None:
        wanted_T &= needed_T.to(device).bool()
    keep_K = wanted_T[1:].nonzero().squeeze(-1)  # position p predicts token p + 1
    rows_K = keep_K if row_T is None else row_T[keep_K]  # where position p sits in the model's input
    targets_K = input_ids_T[keep_K + 1]
    if vision:  # the model's own positions ([3, T] for the Qwen-VL family) and its image inputs
        model_positions = packed_position_ids(model, input_ids_T, seq_lens_N, vision)
        kwargs.update(vision.model_kwargs(device, dtype))
    inputs = {"input_ids": model_ids[None], "position_ids": model_positions.unsqueeze(-2), "use_cache": False}
    inputs.update(kwargs)

    if not _keeps_positions(lm):  # a model without logits_to_keep: full logits, then pick
        out = _from_logits(model(**inputs).logits[0].index_select(0, rows_K), targets_K, temperature, with_entropy)
    else:  # logits_to_keep=0 keeps every position; _RowsThenHead picks rows_K (see its docstring for why)
        head = lm.get_output_embeddings()
        if chunk_size > 0 and _supports_chunking(lm):
            head = _LogprobHead(head, targets_K, temperature, chunk_size, with_entropy, compile)
        with _head_replaced(lm, _RowsThenHead(head, rows_K)):
            out_1K = model(**inputs, logits_to_keep=0).logits
        if isinstance(head, _LogprobHead):
            out = (out_1K[0, :, 0], out_1K[0, :, 1]) if with_entropy else out_1K[0]
        else:
            out = _from_logits(out_1K[0], targets_K, temperature, with_entropy)

    def scattered(values_K: torch.Tensor) -> torch.Tensor:
        """[K] values at the kept tokens, 0 elsewhere (differentiable)."""
        return values_K.new_zeros(input_ids_T.shape[0]).index_put((keep_K + 1,), values_K)

    return (scattered(out[0]), scattered(out[1])) if with_entropy else scattered(out)


def _text_attention(lm: torch.nn.Module) -> str | None:
    """The attention implementation of the model's text decoder (a vision-language model's text_config's)."""
    config = getattr(lm.config, "text_config", None) or lm.config
    return getattr(config, "_attn_implementation", None)


def _from_logits(logits_KV: torch.Tensor, targets_K: torch.Tensor, temperature: float, with_entropy: bool):
    """The targets' logprobs (and the entropies, H = -sum p log p) from full logits at `temperature`."""
    scaled_KV = at_least_float32(logits_KV)
    if temperature != 1.0:
        scaled_KV = scaled_KV / temperature
    if not with_entropy:
        return selective_logprobs(scaled_KV, targets_K)
    logp_KV = torch.log_softmax(scaled_KV, -1)  # kept once for both
    return logp_KV.gather(-1, targets_K[:, None]).squeeze(-1), -(logp_KV.exp() * logp_KV).sum(-1)
