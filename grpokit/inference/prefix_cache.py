"""The builtin engine's prefix KV cache: the keys and values of finished completions, reused by later
prompts that extend them, so that a multi-turn conversation's next turn prefills only its new tokens.

A multi-turn rollout sends each conversation's whole token ids every turn (grpokit.environments.multi_turn):
turn t's prompt is turn t-1's prompt + completion + the environment's tokens. Without this cache the
plain sampler prefills all of it again, so turn t re-runs the prefill of every earlier turn.

- **What is kept.** When a row of the plain sampler finishes (a stop, max_tokens), its keys and values
  for every token it has fed to the model (the prompt and all of the completion but its last token,
  which was sampled and never fed) are copied out, keyed by those token ids. Keys are stored after
  RoPE, at the tokens' own positions (position ids count real tokens, never padding), so they are valid
  wherever the same tokens sit at the same positions.
- **What a prompt reuses.** The longest entry that is a proper prefix of the prompt (at least one token
  runs and gives the next-token logits). Lookup compares token ids, so a hit is exact; an entry that
  diverges from the prompt is not used in part. A prompt sent again as it was never hits (its entries
  are at least as long as it is), so a repeated request gives bit-for-bit the numbers it gave before.
- **A batch with different cached lengths** runs in one forward (grpokit.inference.sampler.prefill):
  each row's cached part is right-aligned in C columns (C = the longest hit), its new tokens right-aligned
  in the N columns after them (N = the longest new part); the columns between are masked holes, like left
  padding. A row without a hit has an all-masked cached part and prefills its whole prompt in the same
  forward. This is exact in real arithmetic (a masked key gets weight exactly 0); in float32 the sums
  run in another order, so logprobs differ by rounding: at most 1.9e-6 on the tests' tiny model
  (tests/inference/test_prefix_cache.py), 1.8e-5 on SmolLM2-135M (docs/benchmarks.md), same tokens.
  In multi-turn rollouts every row of a later turn hits; a batch mixing hits and misses saves less (the
  new block is as wide as the longest miss).
- **Bounded**: at most `max_tokens` cached tokens, least recently used (stored or hit) dropped first; an
  entry that a new one extends is dropped when the new one is stored (the next turn needs the newest).
  Cost: 2 x layers x key-value heads x head dim x dtype bytes per token (SmolLM2-135M in float32: 45 KiB).
- **Only for the weights that computed it.** BuiltinEngine clears it in load_weights (full weights, LoRA
  adapters and the merged copies refreshed from them, QeRL's noisy norms) and share_base_weights, and
  `follow_weights` clears it too when any parameter was re-pointed or written in place since the last call.
- Plain path only: the fast CUDA path (grpokit.inference.fast) has its own static cache and ignores this.
  Models with sliding-window or non-attention (recurrent) layers are refused (`supports`): holes in the
  columns would shift a sliding window, and a recurrent state has no columns.

Shape legend: Y layers, H key-value heads, L cached tokens, D head dim, U rows, C cached columns, W columns.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import torch

log = logging.getLogger(__name__)


def supports(config) -> bool:
    """Whether the model's layers are all full attention (see the module's docstring)."""
    types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in types):
        return False
    return not (getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True))


def weights_version(model: torch.nn.Module) -> tuple:
    """Where each parameter's data is and how often it was written in place (autograd's version counter;
    writes through `.data` are not counted, so the engine clears the cache explicitly on every update)."""
    return tuple((p.data_ptr(), getattr(p, "_version", 0)) for p in model.parameters())


class PrefixCache:
    """Token ids -> the keys and values of those tokens (kv_Y2HLD), least recently used first.

    `computed_tokens` / `reused_tokens` count the prompt tokens that prefill ran / took from the cache
    (distinct prompts, padding excluded), whether or not the cache is on.
    """

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.entries: OrderedDict[tuple[int, ...], torch.Tensor] = OrderedDict()
        self.tokens = 0
        self.computed_tokens = self.reused_tokens = 0
        self._weights: tuple | None = None

    @property
    def enabled(self) -> bool:
        return self.max_tokens > 0

    def clear(self) -> None:
        self.entries.clear()
        self.tokens = 0

    def follow_weights(self, model: torch.nn.Module) -> None:
        """Clear the cache if `model`'s parameters changed since the last call (see weights_version)."""
        if not self.enabled:
            return
        version = weights_version(model)
        if version != self._weights:
            self.clear()
            self._weights = version

    def lookup(self, ids: list[int]) -> tuple[int, torch.Tensor | None]:
        """(k, kv_Y2HLD) of the longest entry that is a proper prefix of the prompt (its first k tokens),
        or (0, None)."""
        best, hit = 0, None
        ids_t = tuple(ids)
        for key in self.entries:
            k = len(key)
            if best < k < len(ids_t) and key[-1] == ids_t[k - 1] and key == ids_t[:k]:
                best, hit = k, key
        if hit is None:
            return 0, None
        self.entries.move_to_end(hit)
        return best, self.entries[hit]

    def past(self, hits: list[tuple[int, torch.Tensor | None]], width: int):
        """A DynamicCache of `width` columns holding each row's cached part right-aligned (holes are zeros;
        the caller masks them)."""
        from transformers import DynamicCache

        some = next(kv for _, kv in hits if kv is not None)
        y, _, h, _, d = some.shape
        kv_Y2UHCD = some.new_zeros((y, 2, len(hits), h, width, d))
        for i, (k, kv) in enumerate(hits):
            if k:
                kv_Y2UHCD[:, :, i, :, width - k :] = kv[..., :k, :]
        cache = DynamicCache()
        for layer in range(y):
            cache.update(kv_Y2UHCD[layer, 0], kv_Y2UHCD[layer, 1], layer)
        return cache

    def keep(self, cache, mask_BW: torch.Tensor, finished: list[tuple[int, list[int]]]) -> None:
        """Store the rows that finished: (batch row, the token ids it has fed the model: prompt + completion
        but its last token). `mask_BW` marks each row's real columns of `cache`."""
        if not (self.enabled and finished):
            return
        layers = _plain_layers(cache)
        if layers is None:
            log.warning("prefix cache: this model's KV cache is not plain full attention; prefix cache off")
            self.max_tokens = 0
            self.clear()
            return
        for j, ids in finished:
            if len(ids) > self.max_tokens:
                continue
            cols_L = mask_BW[j].nonzero().squeeze(-1)
            if cols_L.numel() != len(ids):
                raise RuntimeError(f"prefix cache: row {j} has {cols_L.numel()} cached columns for {len(ids)} tokens")
            kv_Y2HLD = torch.stack(
                [
                    torch.stack([layer.keys[j].index_select(-2, cols_L), layer.values[j].index_select(-2, cols_L)])
                    for layer in layers
                ]
            )  # copies of the row's real columns only: the batch's cache is freed when the batch ends
            self._store(tuple(ids), kv_Y2HLD)

    def _store(self, key: tuple[int, ...], kv_Y2HLD: torch.Tensor) -> None:
        superseded = [k for k in self.entries if len(k) <= len(key) and key[len(k) - 1] == k[-1] and key[: len(k)] == k]
        for old in superseded:
            self.tokens -= len(old)
            del self.entries[old]
        self.entries[key] = kv_Y2HLD
        self.tokens += len(key)
        while self.tokens > self.max_tokens:
            old, _ = self.entries.popitem(last=False)
            self.tokens -= len(old)


def _plain_layers(cache) -> list | None:
    """The cache's layers if each is a plain (not sliding) key/value layer of the same shape, else None."""
    layers = getattr(cache, "layers", None)
    if not layers or any(
        getattr(layer, "is_sliding", False) or getattr(layer, "keys", None) is None for layer in layers
    ):
        return None
    return layers if len({layer.keys.shape for layer in layers}) == 1 else None
