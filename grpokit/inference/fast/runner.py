"""ModelRunner: a Llama-family causal LM run against a static KV cache, decode steps in CUDA graphs.

Why not `model.generate`: Hugging Face's loop grows a DynamicCache by concatenation every step and
launches every kernel from Python, so at batch 256 a 0.6B model spends most of a decode step in the
CPU, not the GPU (see docs/benchmarks.md). This runner keeps the HF model and its modules (so a peft
LoRA wrapper, QeRL's noisy norms and full-weight updates all apply unchanged, by in-place copies) and
replaces only the driver:

- the KV cache is one pre-allocated tensor per K and V, [layers, slots, kv_heads, max_len, head_dim];
  a sequence owns a slot row, so a finished sequence's slot is refilled without moving the others;
- prefill runs right-padded prompts through the modules with causal SDPA and writes their keys and
  values into their slots (right padding keeps real tokens from seeing pads under a causal mask);
- a decode step feeds one token per slot; attention reads the slot's cache up to a length bucket and
  masks positions after the token's own. On CUDA each (slot bucket, length bucket) step is captured
  once in a CUDA graph and replayed, so a step is one launch instead of thousands.

Supported: models whose decoder layers are Llama-shaped (input_layernorm, self_attn with q/k/v/o_proj
and optional q_norm/k_norm, post_attention_layernorm, mlp) with rotary embeddings and full attention:
Llama, Mistral (no sliding window), Qwen2, Qwen3, SmolLM2. Others fail at start with a message.
"""

from __future__ import annotations

import logging
import math
import time

import torch
import torch.nn.functional as F

from grpokit.common.graph_capture import capture_lock
from grpokit.common.models import unwrap_peft
from grpokit.inference.fast.kernels import Kernels, qk_norm_rope

log = logging.getLogger(__name__)
SLOT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
LENGTH_BUCKET = 128  # decode attention reads the cache up to a multiple of this
# decoder layers of these transformers model types are Llama-shaped with Llama's RMSNorm (weight * x_hat)
SUPPORTED_MODEL_TYPES = {"llama", "mistral", "qwen2", "qwen3"}


def check_supported(causal_lm: torch.nn.Module) -> None:
    """Raise with a clear message when the runner cannot drive this architecture."""
    config = causal_lm.config
    name = type(causal_lm).__name__
    core = getattr(causal_lm, "model", None)
    layers = getattr(core, "layers", None)
    problems = []
    if layers is None or not hasattr(core, "rotary_emb") or not hasattr(core, "embed_tokens"):
        problems.append("no model.layers / rotary_emb / embed_tokens")
    else:
        attn = layers[0].self_attn
        for part in ("q_proj", "k_proj", "v_proj", "o_proj"):
            if not hasattr(attn, part):
                problems.append(f"attention has no {part}")
        for part in ("input_layernorm", "post_attention_layernorm", "mlp"):
            if not hasattr(layers[0], part):
                problems.append(f"decoder layer has no {part}")
    if getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        problems.append(
            f"model_type {getattr(config, 'model_type', None)!r} is not one of {sorted(SUPPORTED_MODEL_TYPES)}"
        )
    layer_types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types) or (
        getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None)
    ):
        problems.append("sliding-window layers")
    if problems:
        raise ValueError(
            f"the fast engine path cannot run {name}: {', '.join(problems)}. "
            "Set inference.init_args.fast: off to use the plain sampler, or inference: vllm"
        )


def _fuse(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """Concatenate parameters along dim 0 and re-point each one at its slice of the result; if they already
    are consecutive slices of one storage (a runner built earlier on the same model fused them), return a
    view of that memory instead, so every runner of a model reads the weights that updates copy into."""
    first, at, fused_already = params[0].data, params[0].data.data_ptr(), True
    for p in params:  # contiguous, one after the other in the same storage
        d = p.data
        same_storage = d.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
        fused_already &= same_storage and d.is_contiguous() and d.shape[1:] == first.shape[1:] and d.data_ptr() == at
        at += d.numel() * d.element_size()
    if fused_already:
        size = (sum(p.shape[0] for p in params), *first.shape[1:])
        return first.new_empty(0).set_(first.untyped_storage(), first.storage_offset(), size)
    fused = torch.cat([p.data for p in params])
    start = 0
    for p in params:
        p.data = fused[start : start + p.shape[0]]
        start += p.shape[0]
    return fused


class ModelRunner:
    """Prefill and decode for one model against a static KV cache of `num_slots` x `max_len` tokens."""

    def __init__(
        self, model: torch.nn.Module, num_slots: int, max_len: int, use_cuda_graphs: bool, compile: bool = False
    ) -> None:
        self.model = model
        lm = unwrap_peft(model)
        check_supported(lm)
        self.lm, self.core = lm, lm.model
        config = lm.config
        first = self.core.layers[0].self_attn
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(first, "head_dim", None) or config.hidden_size // self.num_heads
        self.scaling = getattr(first, "scaling", self.head_dim**-0.5)
        weight = self.core.embed_tokens.weight
        self.device, self.dtype = weight.device, weight.dtype
        self.num_slots, self.max_len = num_slots, max_len
        shape = (len(self.core.layers), num_slots, self.num_kv_heads, max_len, self.head_dim)
        _check_kv_fits(shape, self.dtype, self.device)
        self.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        with torch.no_grad():
            positions = torch.arange(max_len, device=self.device)[None]
            cos, sin = self.core.rotary_emb(weight[:1, None], positions)  # dtype follows the model, as in HF
        self.cos_SD, self.sin_SD = cos[0], sin[0]
        self.use_cuda_graphs = use_cuda_graphs and self.device.type == "cuda"
        self.kernels = Kernels(compile and self.device.type == "cuda")
        layer = self.core.layers[0]
        self.norm_eps = getattr(layer.input_layernorm, "variance_epsilon", getattr(config, "rms_norm_eps", 1e-6))
        mlp = layer.mlp
        self.gated_silu = all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")) and getattr(
            config, "hidden_act", ""
        ) in ("silu", "swish")
        self.fused = [self._fuse_projections(layer) for layer in self.core.layers]
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.graph_pool = None
        # static inputs/outputs of the decode step (graphs read and write these addresses)
        self.tokens_B = torch.zeros(num_slots, dtype=torch.long, device=self.device)
        self.positions_B = torch.zeros(num_slots, dtype=torch.long, device=self.device)
        self.logits_BV = torch.zeros(num_slots, lm.config.vocab_size, dtype=self.dtype, device=self.device)

    def _fuse_projections(self, layer) -> tuple | None:
        """Make q/k/v (and gate/up) weights views of one tensor each, so one matrix product serves them.

        Only for plain nn.Linear modules (no LoRA wrapper): the modules keep working (their weights are
        views), in-place weight updates land in the fused tensor, and a decode step launches two
        fewer and one fewer matrix products per layer. Returns (qkv weight, qkv bias or None, gate/up
        weight or None), or None when the projections are wrapped.
        """
        attn, mlp = layer.self_attn, layer.mlp
        qkv = [attn.q_proj, attn.k_proj, attn.v_proj]
        if any(type(m) is not torch.nn.Linear for m in qkv) or len({m.bias is None for m in qkv}) != 1:
            return None
        w = _fuse([m.weight for m in qkv])
        b = _fuse([m.bias for m in qkv]) if qkv[0].bias is not None else None
        gate_up = None
        if (
            self.gated_silu
            and type(mlp.gate_proj) is torch.nn.Linear
            and type(mlp.up_proj) is torch.nn.Linear
            and mlp.gate_proj.bias is None
            and mlp.up_proj.bias is None
        ):
            gate_up = _fuse([mlp.gate_proj.weight, mlp.up_proj.weight])
        return w, b, gate_up

    # ----------------------------------------------------------------------------------------- layers
    def _qkv(self, i: int, x: torch.Tensor, shape: tuple[int, ...]):
        """Layer i's q, k, v of x [*shape, hidden] as [*shape, heads, head_dim], before q/k norms and
        RoPE: one matrix product over the fused weights, or the (possibly LoRA-wrapped) modules."""
        attn, fused = self.core.layers[i].self_attn, self.fused[i]
        if fused is None:
            q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
        else:
            nq, nk = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
            qkv = F.linear(x, fused[0], fused[1])
            q, k, v = qkv[..., :nq], qkv[..., nq : nq + nk], qkv[..., nq + nk :]
        heads = (self.num_heads, self.num_kv_heads, self.num_kv_heads)
        return tuple(t.view(*shape, n, self.head_dim) for t, n in zip((q, k, v), heads))

    @staticmethod
    def _qk_norm_weights(attn) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Qwen3's per-head q/k RMSNorm weights, or (None, None)."""
        return (attn.q_norm.weight, attn.k_norm.weight) if hasattr(attn, "q_norm") else (None, None)

    def _mlp_residual(self, layer, h: torch.Tensor) -> torch.Tensor:
        return h + layer.mlp(layer.post_attention_layernorm(h))

    @torch.no_grad()
    def prefill(self, prompts: list[list[int]], slots: list[int]) -> torch.Tensor:
        """Run `prompts` (token ids) into cache rows `slots`; return the last position's logits [N, V]."""
        n, p = len(prompts), max(len(x) for x in prompts)
        if p >= self.max_len:  # the next token needs a position: one at max_len indexes past the cache
            raise ValueError(
                f"a prompt of {p} tokens leaves no room for a completion in the engine's KV cache of "
                f"{self.max_len} tokens (inference.init_args.max_model_len, or data.seq_len when streaming)"
            )
        ids_NP = torch.zeros((n, p), dtype=torch.long)
        for i, ids in enumerate(prompts):
            ids_NP[i, : len(ids)] = torch.tensor(ids)
        ids_NP = ids_NP.to(self.device)
        slots_N = torch.tensor(slots, device=self.device)
        last_N = torch.tensor([len(x) - 1 for x in prompts], device=self.device)
        cos, sin = self.cos_SD[None, :p, None], self.sin_SD[None, :p, None]  # [1, P, 1, D]
        h = self.core.embed_tokens(ids_NP)
        for i, layer in enumerate(self.core.layers):
            attn = layer.self_attn
            q, k, v = self._qkv(i, layer.input_layernorm(h), (n, p))  # [N, P, H, D]
            q, k = qk_norm_rope(q, k, cos, sin, *self._qk_norm_weights(attn), self.norm_eps)
            self.k_cache[i, slots_N, :, :p] = k.transpose(1, 2)
            self.v_cache[i, slots_N, :, :p] = v.transpose(1, 2)
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2),
                k.transpose(1, 2),
                v.transpose(1, 2),
                is_causal=True,
                scale=self.scaling,
                enable_gqa=self.num_heads != self.num_kv_heads,
            )
            h = h + attn.o_proj(out.transpose(1, 2).reshape(n, p, -1))
            h = self._mlp_residual(layer, h)
        h_last = h[torch.arange(n, device=self.device), last_N]
        return self.lm.lm_head(self.core.norm(h_last))

    def _decode_step(self, b: int, s: int) -> None:
        """One token per slot in slots[:b]; attention over cache positions [0, s); writes logits_BV[:b].

        The elementwise work goes through self.kernels (fused by torch.compile on CUDA); the matrix
        products through the model's own modules.
        """
        kn, eps = self.kernels, self.norm_eps
        tokens_B, positions_B = self.tokens_B[:b], self.positions_B[:b]
        rows_B = torch.arange(b, device=self.device)
        cos, sin = self.cos_SD[positions_B][:, None], self.sin_SD[positions_B][:, None]  # [B, 1, D]
        visible_BS = torch.arange(s, device=self.device)[None] <= positions_B[:, None]
        h = self.core.embed_tokens(tokens_B)
        layers = self.core.layers
        x = kn.rms_norm(h, layers[0].input_layernorm.weight, eps)
        for i, layer in enumerate(layers):
            attn, fused = layer.self_attn, self.fused[i]
            q, k, v = self._qkv(i, x, (b,))  # [B, H, D]
            q, k = kn.qk_norm_rope(q, k, cos, sin, *self._qk_norm_weights(attn), eps)
            self.k_cache[i, rows_B, :, positions_B] = k
            self.v_cache[i, rows_B, :, positions_B] = v
            out = kn.decode_attention(
                q, self.k_cache[i, :b, :, :s], self.v_cache[i, :b, :, :s], visible_BS, self.scaling
            )
            h, x = kn.add_rms_norm(h, attn.o_proj(out), layer.post_attention_layernorm.weight, eps)
            mlp = layer.mlp
            if fused is not None and fused[2] is not None:
                gate, up = F.linear(x, fused[2]).chunk(2, dim=-1)
                delta = mlp.down_proj(kn.silu_mul(gate, up))
            elif self.gated_silu:
                delta = mlp.down_proj(kn.silu_mul(mlp.gate_proj(x), mlp.up_proj(x)))
            else:
                delta = mlp(x)
            next_norm = layers[i + 1].input_layernorm.weight if i + 1 < len(layers) else self.core.norm.weight
            h, x = kn.add_rms_norm(h, delta, next_norm, eps)
        self.logits_BV[:b].copy_(self.lm.lm_head(x))

    def bucket(self, width: int, max_position: int) -> tuple[int, int]:
        """(slot bucket, length bucket) of a decode step over slots [0, width) up to `max_position`."""
        b = min(next((x for x in SLOT_BUCKETS if x >= width), self.num_slots), self.num_slots)
        s = min(self.max_len, -(-(max_position + 1) // LENGTH_BUCKET) * LENGTH_BUCKET)
        return b, s

    @torch.no_grad()
    def step(self, b: int, s: int) -> torch.Tensor:
        """Decode tokens_B[:b] at positions_B[:b] (device buffers the caller fills); return logits [b, V]."""
        if not self.use_cuda_graphs:
            self._decode_step(b, s)
        else:
            graph = self.graphs.get((b, s))
            if graph is None:  # a bucket first used: captured now (GRPOKIT_LOG_LEVEL=DEBUG shows what it cost)
                start = time.perf_counter()
                graph = self._capture(b, s)
                seconds = time.perf_counter() - start
                log.debug("decode graph %d slots x %d positions: captured in %.2fs", b, s, seconds)
            graph.replay()
        return self.logits_BV[:b]

    @torch.no_grad()
    def decode(self, tokens: list[int], positions: list[int]) -> torch.Tensor:
        """Feed tokens[i] at positions[i] into slot i for every i < len(tokens); return logits [len, V].

        Rows past len(tokens) up to the slot bucket run at position 0 of their own slot (results ignored).
        """
        n = len(tokens)
        b, s = self.bucket(n, max(positions))
        host = torch.zeros((2, b), dtype=torch.long)
        host[0, :n], host[1, :n] = torch.tensor(tokens), torch.tensor(positions)
        self.tokens_B[:b].copy_(host[0])
        self.positions_B[:b].copy_(host[1])
        return self.step(b, s)[:n]

    def _capture(self, b: int, s: int) -> torch.cuda.CUDAGraph:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm up allocator and lazy inits outside the capture
                self._decode_step(b, s)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # In co-locate mode this runs in the orchestrator's thread while the trainer works on the main
        # thread. thread_local: the default ("global") fails the capture when any other thread makes an
        # unsafe CUDA call meanwhile (a cudaMalloc of the trainer's allocator). A device-wide sync or a
        # random op elsewhere still breaks it in any mode: capture_lock keeps the trainer's step apart.
        with capture_lock(self.device):
            with torch.cuda.graph(graph, pool=self.graph_pool, capture_error_mode="thread_local"):
                self._decode_step(b, s)
        if self.graph_pool is None:
            self.graph_pool = graph.pool()
        self.graphs[(b, s)] = graph
        return graph


def _check_kv_fits(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
    """Refuse, naming the sizes and the fix, a K+V cache larger than the GPU's free memory (CUDA's own
    out-of-memory error names neither the rows nor the length that asked for it)."""
    if device.type != "cuda":
        return
    need = 2 * math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    # the caching allocator's reserved but unused blocks count as free: it releases them and retries
    # before it fails an allocation (an old cache freed a moment ago is still reserved)
    free = torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if need > free:
        layers, slots, kv_heads, max_len, head_dim = shape
        raise ValueError(
            f"the fast path's KV cache for {slots} rows of {max_len} tokens needs {need / 2**30:.1f} GiB "
            f"({layers} layers x {kv_heads} KV heads x {head_dim} x K and V) but the GPU has {free / 2**30:.1f} "
            "GiB free: lower the rows (inference.init_args.max_batch_size, or data.streaming.max_inflight) "
            "or the length (data.sampling.max_tokens, data.seq_len, inference.init_args.max_model_len), "
            "or open the stream with a max_len"
        )
