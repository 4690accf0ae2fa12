"""The builtin engine: the policy's model in this process, sampled with grpokit's torch sampler.

Plain and correct, runs on any device torch runs on. LoRA updates are loaded into a peft wrapper of a
private copy of the base model, so the engine never shares tensors with the trainer by accident.
"""

from __future__ import annotations

import logging

import torch

from grpokit.inference import Completion, InferenceEngine, SamplingSettings
from grpokit.inference.sampler import sample
from grpokit.models import load_causal_lm, load_tokenizer, parse_dtype
from grpokit.norm_noise import apply_norm_weights
from grpokit.types import WeightUpdate

log = logging.getLogger(__name__)


class BuiltinEngine(InferenceEngine):
    """In-process torch engine: batched sampling with a KV cache and per-token logprobs."""

    applies_norm_weights = True  # QeRL's noisy norms are copied into the base model in place

    def __init__(self, dtype: str = "float32", max_batch_size: int = 64, device: str = "auto") -> None:
        """
        Args:
            dtype: dtype of the engine's weights (float32, bfloat16).
            max_batch_size: sequences decoded together; larger requests are split.
            device: "auto" (CUDA when available, else CPU), "cpu" or "cuda".
        """
        self.dtype = parse_dtype(dtype)
        self.max_batch_size = max_batch_size
        self.device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
        self.model = None
        self.weight_step = -1

    def setup(self, model: str) -> None:
        self.tokenizer = load_tokenizer(model)
        self.model = load_causal_lm(model, dtype=self.dtype).to(self.device).eval()
        self.stop_token_ids = {self.tokenizer.eos_token_id}
        eos = self.model.generation_config.eos_token_id if self.model.generation_config else None
        self.stop_token_ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])

    def load_weights(self, update: WeightUpdate) -> None:
        if update.lora_config is not None:
            from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

            if not hasattr(self.model, "peft_config"):
                known = set(LoraConfig.__dataclass_fields__)
                config = LoraConfig(**{k: v for k, v in update.lora_config.items() if k in known})
                self.model = get_peft_model(self.model, config).eval()
            result = set_peft_model_state_dict(self.model, {k: v.to(self.device) for k, v in update.tensors.items()})
            if getattr(result, "unexpected_keys", None):
                raise ValueError(f"adapter of step {update.step} has keys the engine's model lacks: {result.unexpected_keys[:5]}")
        else:
            self.model.load_state_dict({k: v.to(self.device) for k, v in update.tensors.items()}, strict=False)
        if update.norm_tensors:
            apply_norm_weights(self.model, update.norm_tensors)
        self.weight_step = update.step

    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingSettings) -> list[list[Completion]]:
        if self.model is None:
            raise RuntimeError("BuiltinEngine.generate called before setup(model)")
        generator = torch.Generator(device=self.device).manual_seed(sampling.seed)
        flat = [ids for ids in prompts for _ in range(n)]
        results = []
        for start in range(0, len(flat), self.max_batch_size):
            chunk = flat[start : start + self.max_batch_size]
            results += sample(self.model, chunk, sampling, self.stop_token_ids, self.tokenizer.pad_token_id, generator, self.tokenizer.decode)
        completions = [Completion(tokens, logprobs, truncated, self.weight_step) for tokens, logprobs, truncated in results]
        return [completions[i * n : (i + 1) * n] for i in range(len(prompts))]

    def close(self) -> None:
        self.model = None
