"""The builtin engine: the policy's model in this process, sampled with grpokit's torch sampler.

Runs on any device torch runs on. Two paths over the same model: the plain sampler (HF forward with
a DynamicCache, left-padded batches, the LoRA adapter merged into the weights while sampling:
grpokit.inference.merged_lora) and the fast path (grpokit.inference.fast: static KV cache,
decode steps replayed from CUDA graphs, continuous batching), the default on CUDA. LoRA updates are
loaded into a peft wrapper of the base model (in place, so captured graphs stay valid). The plain path
keeps finished completions' KV cache (grpokit.inference.prefix_cache), so that a multi-turn
conversation's next turn prefills only its new tokens. The base model is the engine's own copy, except
in co-locate `fit` with LoRA, where `share_base_weights` points it at the trainer's frozen base weights
(one copy in memory instead of two; grpokit.trainer.callbacks.ShareBaseWeights).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Literal

import torch

from grpokit.common.checksums import tensors_sha256
from grpokit.common.models import load_causal_lm, load_tokenizer, parse_dtype, unwrap_peft
from grpokit.common.noisy_norms import apply_norm_weights, norm_weights
from grpokit.inference import Completion, InferenceEngine, NewTokens, SamplingSettings, ServingOptions
from grpokit.inference.fast.continuous import generate_continuous
from grpokit.inference.fast.runner import LENGTH_BUCKET, ModelRunner
from grpokit.inference.merged_lora import MergedLoRA, mergeable
from grpokit.inference.prefix_cache import PrefixCache, supports
from grpokit.inference.sampler import sample_rows
from grpokit.types import WeightUpdate

log = logging.getLogger(__name__)


class BuiltinEngine(InferenceEngine):
    """In-process torch engine: batched sampling with a KV cache and per-token logprobs."""

    applies_norm_weights = True  # QeRL's noisy norms are copied into the base model in place
    takes_serving_options = True  # streaming and cancellation on both paths; top logprobs on the plain one
    later_turn_images = True  # a request's vision is the whole sequence's (image_rows prefills it whole)

    def __init__(
        self,
        dtype: str = "float32",
        max_batch_size: int = 64,
        device: str = "auto",
        fast: Literal["auto", "on", "off"] = "auto",
        max_model_len: int | None = None,
        cuda_graphs: bool = True,
        compile: bool = True,
        share_weights: bool = True,
        merge_lora: Literal["auto", "on", "off"] = "auto",
        prefix_cache_tokens: int = 8192,
    ) -> None:
        """
        Args:
            dtype: dtype of the engine's weights (float32, bfloat16).
            max_batch_size: sequences decoded together (the fast path's KV-cache slots); more
                requests wait in a queue (fast path) or are split into batches (plain path).
            device: "auto" (CUDA when available, else CPU), "cpu" or "cuda".
            fast: the static-cache / continuous-batching path: "auto" = on for CUDA, off for CPU.
            max_model_len: longest prompt + completion (the fast path's cache size); null = the model's
                max_position_embeddings.
            cuda_graphs: replay decode steps from CUDA graphs on the fast path (CUDA only).
            compile: fuse the decode step's elementwise work with torch.compile (CUDA only; the first
                generate call compiles, about a minute, per slot bucket in use).
            share_weights: in co-locate `fit` with LoRA, sample with the trainer's frozen base weights
                instead of a second copy (share_base_weights); false keeps the engine's own copy.
            merge_lora: sample with W + s * B @ A folded into merged copies of the adapted weights,
                refreshed at each adapter update (grpokit.inference.merged_lora; plain path only):
                "auto" = on in float32, where it is exact to rounding; off keeps peft's unmerged layers
                (in bfloat16 the merge would round the adapter's update away).
            prefix_cache_tokens: keep the KV cache of up to this many tokens of finished completions (least
                recently used dropped first), so that a prompt extending one (a multi-turn conversation's
                next turn) prefills only its new tokens (grpokit.inference.prefix_cache; plain path only;
                0 = off; dropped at every weight update). SmolLM2-135M in float32: 45 KiB a token.
        """
        if prefix_cache_tokens < 0:
            raise ValueError(f"inference.init_args.prefix_cache_tokens must be >= 0, got {prefix_cache_tokens}")
        self.dtype = parse_dtype(dtype)
        self.max_batch_size = max_batch_size
        self.device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
        self.fast = fast == "on" or (fast == "auto" and str(self.device).startswith("cuda"))
        self.reports_top_logprobs = not self.fast  # the fast path's device-side bookkeeping keeps no top-k
        self.max_model_len = max_model_len
        self.cuda_graphs, self.compile, self.share_weights = cuda_graphs, compile, share_weights
        if merge_lora == "on" and self.fast:
            raise ValueError(
                "inference.init_args.merge_lora: on needs the plain path (the fast path's "
                "graphs read the weights in place); set fast: off or merge_lora: auto"
            )
        self.merge_lora = merge_lora
        self._merge = merge_lora == "on" or (merge_lora == "auto" and not self.fast and self.dtype == torch.float32)
        self.merged = None  # MergedLoRA, built at the first adapter update when merge_lora is on
        self.prefix_cache_tokens = prefix_cache_tokens
        self.prefix_cache = PrefixCache(0)  # sized in setup, once the model says whether it can use one
        self.model = None
        self.runner = None
        self.weight_step = -1
        self._writes = None  # CUDA event after the last weight write (see _own_stream)

    def setup(self, model: str) -> None:
        self.tokenizer = load_tokenizer(model)
        self.model = load_causal_lm(model, dtype=self.dtype).to(self.device).eval()
        if self.max_model_len is None:
            self.max_model_len = getattr(self.model.config, "max_position_embeddings", None) or 4096
        self.stop_token_ids = {self.tokenizer.eos_token_id}
        eos = self.model.generation_config.eos_token_id if self.model.generation_config else None
        self.stop_token_ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self.vocab_size = self.model.get_output_embeddings().weight.shape[0]  # the logits' width
        usable = not self.fast and supports(self.model.config)
        self.prefix_cache = PrefixCache(self.prefix_cache_tokens if usable else 0)
        self._mark_written()

    def load_weights(self, update: WeightUpdate) -> None:
        self.prefix_cache.clear()  # cached keys and values hold only for the weights that computed them
        if update.lora_config is not None:
            from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

            if not hasattr(self.model, "peft_config"):
                known = set(LoraConfig.__dataclass_fields__)
                config = LoraConfig(**{k: v for k, v in update.lora_config.items() if k in known})
                self.model = get_peft_model(self.model, config).eval()
                self.runner = None  # the module structure changed: captured graphs are stale
                if self._merge and (self.merge_lora == "on" or mergeable(self.model)):  # "on" refuses a DoRA adapter
                    self.merged = MergedLoRA(self.model)
            result = set_peft_model_state_dict(self.model, {k: v.to(self.device) for k, v in update.tensors.items()})
            if getattr(result, "unexpected_keys", None):
                raise ValueError(
                    f"adapter of step {update.step} has keys the engine's model lacks: {result.unexpected_keys[:5]}"
                )
            if self.merged is not None:
                self.merged.refresh()
        else:
            self.model.load_state_dict({k: v.to(self.device) for k, v in update.tensors.items()}, strict=False)
        if update.norm_tensors:
            apply_norm_weights(self.model, update.norm_tensors)
        self.weight_step = update.step
        self._mark_written()

    def share_base_weights(self, trainer_model: torch.nn.Module) -> int:
        """Co-locate with LoRA: point this engine's base weights at the trainer's frozen copies of the same
        weights (same name, shape, dtype and device), freeing the engine's own; returns the bytes shared.

        Only frozen trainer weights are taken (under full fine-tuning every weight trains, so nothing is
        shared: the engine must keep the weights of the step it samples with), never RMSNorm weights
        (QeRL's noisy norms are written into the engine's in place) nor anything the trainer holds
        quantized or sharded (dtype or shape differ). Captured CUDA graphs read the old addresses, so
        the fast path's runner is rebuilt.
        """

        def base_name(name: str) -> str:
            return name.removeprefix("base_model.model.").replace(".base_layer.", ".")

        frozen = {base_name(n): p for n, p in trainer_model.named_parameters() if not p.requires_grad}
        norms = set(norm_weights(self.model))
        shared, seen = 0, set()
        for name, param in unwrap_peft(self.model).named_parameters():
            source = frozen.get(base_name(name))
            if name in norms or source is None or id(param) in seen or type(source.data) is not torch.Tensor:
                continue
            if (source.shape, source.dtype, source.device) != (param.shape, param.dtype, param.device):
                continue
            seen.add(id(param))
            param.data = source.data
            shared += param.numel() * param.element_size()
        if shared:
            self.runner = None
            self.prefix_cache.clear()
            if self.merged is not None:
                self.merged.refresh()  # same values; merged from the tensors the base now points at
            self._mark_written()
        return shared

    def weights_sha256(self) -> str:
        """The adapter loaded into the peft wrapper (as the trainer's `get_peft_model_state_dict`
        names it), or the whole state dict before any LoRA update and for full fine-tuning."""
        if hasattr(self.model, "peft_config"):
            from peft import get_peft_model_state_dict

            return tensors_sha256(get_peft_model_state_dict(self.model))
        return tensors_sha256(self.model.state_dict())

    def loaded_tensors(self, update: WeightUpdate) -> dict[str, torch.Tensor]:
        """The peft adapter (the trainer's `get_peft_model_state_dict` names) and the RMSNorm weights
        (base-model names) with a LoRA update; the whole state dict (norms included) with a full one."""
        if update.lora_config is None:
            return self.model.state_dict()
        if not hasattr(self.model, "peft_config"):
            return norm_weights(self.model)  # no adapter loaded at all: every adapter name is missing
        from peft import get_peft_model_state_dict

        return {**get_peft_model_state_dict(self.model), **norm_weights(self.model)}

    def context_length(self) -> int | None:
        return self.max_model_len

    @property
    def samples_images(self) -> bool:
        """Prompts with images are sampled on the plain path only (grpokit.inference.image_rows)."""
        return not self.fast

    def open_stream(
        self, sampling: SamplingSettings, max_rows: int, on_update: str = "continue", max_len: int | None = None
    ):
        """Both paths stream natively: the plain one (grpokit.inference.decode_stream) and the fast one
        (grpokit.inference.fast.stream); on the plain path, models whose KV cache is not plain full
        attention run whole batches (grpokit.inference.streams)."""
        if self.model is None:
            raise RuntimeError("BuiltinEngine.open_stream called before setup(model)")
        if on_update == "finish":
            raise ValueError(
                "data.streaming.on_update: finish lets unfinished rollouts end on the weights they began with, "
                "which needs a server engine (RemoteEngine, VLLMEngine); BuiltinEngine holds one set of weights: "
                "set on_update to continue or regenerate"
            )
        if self.fast:
            from grpokit.inference.fast.stream import FastStream

            return FastStream(self, sampling, max_rows, on_update, max_len)
        if not supports(self.model.config):
            return super().open_stream(sampling, max_rows, on_update)
        from grpokit.inference.decode_stream import DecodeStream

        return DecodeStream(self, sampling, max_rows, on_update)

    def generate(
        self, prompts: list[list[int]], n: int, sampling: SamplingSettings, options: ServingOptions | None = None
    ) -> list[list[Completion]]:
        if self.model is None:
            raise RuntimeError("BuiltinEngine.generate called before setup(model)")
        stop_token_ids = self._stop_token_ids(sampling)
        # seed null: settings not from a recipe (tests, bench)
        generator = torch.Generator(device=self.device).manual_seed(sampling.seed or 0)
        flat = [ids for ids in prompts for _ in range(n)]
        if self.fast:
            completions = self._generate_fast(flat, sampling, stop_token_ids, generator, options)
        else:
            self.prefix_cache.follow_weights(self.model)
            completions = []
            for start in range(0, len(flat), self.max_batch_size):
                if options is not None and options.is_cancelled():
                    break
                with self.merged.active() if self.merged is not None else contextlib.nullcontext():
                    rows = sample_rows(
                        self.model,
                        flat[start : start + self.max_batch_size],
                        sampling,
                        stop_token_ids,
                        self.tokenizer.pad_token_id,
                        generator,
                        self.tokenizer.decode,
                        options,
                        start,
                        self.prefix_cache,
                    )
                completions += [
                    Completion(r.token_ids, r.logprobs, not r.done, self.weight_step, r.top_logprobs) for r in rows
                ]
            completions += [Completion.aborted(self.weight_step) for _ in flat[len(completions) :]]  # cancelled
        return [completions[i * n : (i + 1) * n] for i in range(len(prompts))]

    def _stop_token_ids(self, sampling: SamplingSettings) -> set[int]:
        """The model's EOS ids and the settings' stop_token_ids, which must be in the vocabulary."""
        outside = [t for t in sampling.stop_token_ids if not 0 <= t < self.vocab_size]
        if outside:
            raise ValueError(
                f"data.sampling.stop_token_ids {outside} are outside the vocabulary [0, {self.vocab_size})"
            )
        return self.stop_token_ids | set(sampling.stop_token_ids)

    def _generate_fast(
        self,
        flat: list[list[int]],
        sampling: SamplingSettings,
        stop_token_ids: set[int],
        generator,
        options: ServingOptions | None,
    ) -> list[Completion]:
        """The fast path: no top logprobs (refused); a streamed request gets each completion whole when it
        ends, and a cancelled one stops at the next look at the slots (every few decode steps)."""
        if options is not None and options.top_logprobs:
            raise ValueError(
                "BuiltinEngine's fast path (inference.init_args.fast, on by default on CUDA) reports no top "
                "logprobs; set fast: off to have them"
            )
        on_done = None
        if options is not None and options.on_tokens is not None:
            on_done = lambda i, tokens, logprobs: options.on_tokens([NewTokens(i, tokens, logprobs)])  # noqa: E731
        with self._own_stream():
            results = generate_continuous(
                self._runner(flat, sampling),
                flat,
                sampling,
                stop_token_ids,
                generator,
                self.tokenizer.decode,
                cancelled=options.is_cancelled if options is not None else None,
                on_done=on_done,
            )
        return [Completion(*r, self.weight_step) if r else Completion.aborted(self.weight_step) for r in results]

    @contextlib.contextmanager
    def _own_stream(self):
        """On CUDA, sample on the engine's own stream, so that in co-locate mode (the orchestrator's
        thread) decoding overlaps the trainer's kernels on the default stream instead of queueing
        behind them (bench step measures the overlap)."""
        if not str(self.device).startswith("cuda"):
            yield
            return
        if getattr(self, "_stream", None) is None:
            self._stream = torch.cuda.Stream(device=self.device)
        if self._writes is not None:  # weight writes before sampling
            self._stream.wait_event(self._writes)
            self._writes = None
        with torch.cuda.stream(self._stream):
            yield
        self._stream.synchronize()

    def _mark_written(self) -> None:
        """Weights were written on the calling thread's current stream (the default one, which the trainer
        shares in co-locate mode): the next sampling on the engine's stream waits for those writes only,
        not for every kernel the trainer queued there since (waiting on the whole stream at each streamed
        advance would queue the decode behind a micro-batch's forward and backward)."""
        if str(self.device).startswith("cuda"):
            self._writes = torch.cuda.Event()
            self._writes.record(torch.cuda.current_stream(self.device))

    def _runner(self, flat: list[list[int]], sampling: SamplingSettings) -> ModelRunner:
        """The fast path's runner, (re)built when the cache is too small for this request."""
        need_len = min(
            self.max_model_len, -(-(max(len(x) for x in flat) + sampling.max_tokens) // LENGTH_BUCKET) * LENGTH_BUCKET
        )
        return self.sized_runner(min(self.max_batch_size, len(flat)), need_len)

    def sized_runner(self, need_slots: int, need_len: int) -> ModelRunner:
        """The fast path's runner with at least `need_slots` slots of `need_len` tokens."""
        r = self.runner
        if r is None or r.num_slots < need_slots or r.max_len < need_len:
            self.runner = None  # free the old cache first
            self.runner = ModelRunner(self.model, need_slots, need_len, self.cuda_graphs, self.compile)
        return self.runner

    def close(self) -> None:
        self.runner = None
        self.model = None
        self.prefix_cache.clear()
