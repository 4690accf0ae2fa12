"""vLLM worker extension: grpokit's NCCLBroadcast received inside vLLM's own worker process.

vLLM loads it with `--worker-extension-cls grpokit.inference.vllm.worker.NCCLWeightReceiver` (added by
`grpokit infer` when `broadcast: VLLMNCCLBroadcast`), which mixes these methods into its worker class;
VLLMNCCLBroadcast calls them through vLLM's `POST /collective_rpc` (served with VLLM_SERVER_DEV_MODE=1):

- `grpokit_join(settings)`: the worker becomes the engine end (rank 1) of the trainer's NCCLBroadcast
  group; a daemon thread receives every update into a "newest" slot (grpokit.broadcast.nccl).
  Idempotent while the trainer is there; once it has gone, the next call joins a new group.
- `grpokit_apply(after_step)`: applies the newest received update newer than `after_step`, in the
  worker's main thread (collective_rpc runs between engine steps). Full weights go through the model's
  own `load_weights` inside vLLM's layerwise reload, as vLLM's NCCL weight transfer does, then vLLM's
  LoRA state is reset; a LoRA update is written as a peft adapter folder on the server's disk
  (`adapter_dir/step_N`) for `/v1/load_lora_adapter`, so no shared filesystem is needed. QeRL's noisy
  RMSNorm weights (`update.norm_tensors`, grpokit.common.noisy_norms) go into vLLM's own norm parameters in both
  modes: loaded with the full weights in the same reload, where they replace the clean norms, or, with a
  LoRA update, by the model's `load_weights` with just those tensors (the adapter goes the LoRA way).
  Returns {"step", "lora_path", "lora_config", "sha256" of the received tensors, "norms_sha256" of the
  received norms (null without)}, or {"step": null, "receiving"} when nothing newer has arrived.
- `grpokit_parameters_sha256()`: the sha256 of each of vLLM's parameters (its own, fused, layout).

This module is imported inside vLLM's process, so it needs only torch, safetensors and grpokit's
broadcast code (grpokit infer puts grpokit on the server's PYTHONPATH). One worker joins a group of two
ranks: vLLM must run with tensor_parallel_size 1 and data_parallel_size 1 on this path.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

import torch

from grpokit.broadcast.nccl import NCCLBroadcast, as_bytes
from grpokit.common.checksums import tensors_sha256
from grpokit.common.io import atomic_save_tensors, atomic_write_json

KEEP_ADAPTERS = 3  # adapter folders kept on the server's disk; vLLM reads each once, when it is loaded


class NCCLWeightReceiver:
    """Mixed into vLLM's worker: join grpokit's NCCLBroadcast group and apply its updates."""

    def grpokit_join(self, settings: str) -> dict:
        """Join the trainer's group with NCCLBroadcast(**settings) plus `adapter_dir` (null: a temp folder);
        a receiver whose trainer has gone (closed, crashed, restarted) is replaced by a new one."""
        receiver = getattr(self, "_grpokit_receiver", None)
        if receiver is None or not receiver.receiving:
            if receiver is not None:
                receiver.close()
            kwargs = json.loads(settings)
            folder = kwargs.pop("adapter_dir", None)
            self._grpokit_adapters = Path(folder or tempfile.mkdtemp(prefix="grpokit-adapters-"))
            self._grpokit_adapters.mkdir(parents=True, exist_ok=True)
            self._grpokit_receiver = NCCLBroadcast(**kwargs)
            self._grpokit_receiver.poll(-1)  # starts the receiving thread, which joins the group
        return {"joined": True, "adapter_dir": str(self._grpokit_adapters)}

    def grpokit_apply(self, after_step: str) -> dict:
        """Apply the newest received update newer than `after_step` (see the module docstring);
        {"step": null, "receiving": false} once the trainer has gone, so the caller joins again."""
        receiver = self._grpokit_receiver
        try:
            update = receiver.poll(int(after_step))
        except RuntimeError:  # the receiver stopped on an error (the trainer died mid-update): join anew
            update = None
        if update is None:
            return {"step": None, "receiving": receiver.receiving}
        received = tensors_sha256(update.tensors)  # what arrived, for checks against the trainer's
        norms = tensors_sha256(update.norm_tensors) if update.norm_tensors else None
        if update.lora_config is not None:
            self._grpokit_load_norms(update.norm_tensors)
            return {
                "step": update.step,
                "lora_path": self._grpokit_write_adapter(update),
                "lora_config": update.lora_config,
                "sha256": received,
                "norms_sha256": norms,
            }
        self._grpokit_load_full({**update.tensors, **update.norm_tensors})  # the noisy norms replace the clean ones
        return {"step": update.step, "lora_path": None, "lora_config": None, "sha256": received, "norms_sha256": norms}

    def grpokit_parameters_sha256(self) -> dict:
        """{name: sha256 of the raw bytes} of every parameter of vLLM's model."""
        model = self.model_runner.get_model()
        return {
            name: hashlib.sha256(as_bytes(p.detach().contiguous().cpu()).numpy().tobytes()).hexdigest()
            for name, p in model.named_parameters()
        }

    def _grpokit_load_full(self, tensors: dict[str, torch.Tensor]) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

        model = self.model_runner.get_model()
        initialize_layerwise_reload(model)
        model.load_weights(weights=iter(tensors.items()))
        finalize_layerwise_reload(model, self.model_runner.model_config)
        _reprocess_tied(model)
        if hasattr(self.model_runner, "reset_lora_state"):  # cached LoRA state refers to the old base
            self.model_runner.reset_lora_state()

    def _grpokit_load_norms(self, norms: dict[str, torch.Tensor]) -> None:
        """Copy QeRL's noisy norms (base-model names, which vLLM's Llama-family models keep for their
        RMSNorms) into the base model by its own `load_weights`, converting to vLLM's dtype. No layerwise
        reload: a norm's weight is used as stored, and a reload of a few layers would warn about every
        other one. The LoRA layers are not touched; the step's adapter is loaded through vLLM's LoRA path."""
        if not norms:
            return
        loaded = self.model_runner.get_model().load_weights(weights=iter(norms.items()))
        missing = sorted(set(norms) - set(loaded or ()))
        if missing:
            raise ValueError(
                f"vLLM's model did not load the noisy norm weights {missing[:5]}: trainer and "
                "server must serve the same model.model (or turn model.noise_scheduler off)"
            )

    def _grpokit_write_adapter(self, update) -> str:
        folder = self._grpokit_adapters / f"step_{update.step}"
        atomic_save_tensors(folder / "adapter_model.safetensors", update.tensors, metadata={"format": "pt"})
        atomic_write_json(folder / "adapter_config.json", update.lora_config)
        steps = sorted(int(p.name[5:]) for p in self._grpokit_adapters.glob("step_*") if p.name[5:].isdigit())
        for old in steps[:-KEEP_ADAPTERS]:
            shutil.rmtree(self._grpokit_adapters / f"step_{old}", ignore_errors=True)
        return str(folder)


def _reprocess_tied(model: torch.nn.Module) -> None:
    """Redo the post-load processing of modules that share a weight (an LM head tied to the input
    embedding). The shared weight is loaded under one name only, so the layerwise reload reprocesses one
    of its modules; vLLM's CPU build packs a separate copy of the LM head for its GEMM, which then kept
    the old values (measured: logprobs of the new weights everywhere but the output projection)."""
    by_weight: dict[int, list[torch.nn.Module]] = {}
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.nn.Parameter):
            by_weight.setdefault(id(weight), []).append(module)
    for modules in by_weight.values():
        for module in modules if len(modules) > 1 else ():
            method = getattr(module, "quant_method", None)
            if method is not None and hasattr(method, "process_weights_after_loading"):
                method.process_weights_after_loading(module)
