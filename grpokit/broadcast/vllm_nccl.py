"""NCCL weight broadcast into vLLM: the trainer's NCCLBroadcast, received by vLLM's own worker.

The trainer end is NCCLBroadcast's (rank 0, bucketed broadcasts, no pickle). The engine end (rank 1) is
not in the process that polls: it is vLLM's worker, extended by grpokit.inference.vllm.worker
(`grpokit infer` starts vLLM with that `--worker-extension-cls` when the recipe names this broadcast).
`poll(after_step)`, called by the orchestrator (any process), goes over HTTP to the server's
`/collective_rpc`: the first call makes the worker join the trainer's group, and each call makes it
apply the newest update it has received. The update `poll` returns carries no tensors: the weights are
in vLLM already (`in_engine`), or, for LoRA, in an adapter folder on the server's own disk (`path`),
which VLLMEngine then loads with `/v1/load_lora_adapter`. So neither the weights nor the adapters need
a filesystem shared between trainer, orchestrator and server.

Needs vLLM's development endpoints (VLLM_SERVER_DEV_MODE=1, set by `grpokit infer`), which are
unauthenticated like the rest of the server: keep it on loopback or a trusted network. One server with
tensor_parallel_size and data_parallel_size 1 (the group has exactly two ranks).
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from typing import Literal

from grpokit.broadcast.nccl import NCCLBroadcast
from grpokit.types import WeightUpdate

log = logging.getLogger(__name__)
WORKER_EXTENSION = "grpokit.inference.vllm.worker.NCCLWeightReceiver"


class VLLMNCCLBroadcast(NCCLBroadcast):
    """NCCL (or gloo) weights from the trainer straight into a vLLM server's worker."""

    vllm_worker_extension = WORKER_EXTENSION  # `grpokit infer` starts vLLM with it
    applies_norm_weights = True  # the worker loads QeRL's noisy norms into vLLM's model with each update
    keeps_steps = False  # the worker applies each step as it arrives: no older step to pick (data.deterministic)
    observable = True  # `poll` is an HTTP call into vLLM's worker (the receiver), made by the orchestrator

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 29555,
        timeout: float = 600.0,
        backend: Literal["nccl", "gloo"] = "nccl",
        bucket_mb: int = 256,
        base_url: str = "http://127.0.0.1:8000/v1",
        adapter_dir: str | None = None,
    ) -> None:
        """
        Args:
            host: the trainer's address; the trainer listens on it and vLLM's worker connects.
            port: TCPStore port on the trainer.
            timeout: seconds to wait for the other side to join, and for any one broadcast.
            backend: "nccl" (CUDA tensors, one GPU per rank) or "gloo" (CPU).
            bucket_mb: the largest single broadcast, in MiB.
            base_url: the vLLM server whose worker receives the weights (ending in /v1).
            adapter_dir: where the worker writes received LoRA adapters, on the server's machine
                (null: a temporary folder there).
        """
        super().__init__(host, port, timeout, backend, bucket_mb)
        self.base_url, self.adapter_dir = base_url.rstrip("/"), adapter_dir
        self._joined, self._last_warning = False, 0.0
        self.last_applied: dict | None = None

    def poll(self, after_step: int, upto: int | None = None) -> WeightUpdate | None:
        if upto is not None:
            raise ValueError(
                "VLLMNCCLBroadcast applies each step inside vLLM as it arrives and cannot load an older one: "
                "set data.deterministic: false, or use broadcast: FilesystemBroadcast"
            )
        try:
            if not self._joined:
                settings = {
                    "host": self.host,
                    "port": self.port,
                    "timeout": self.timeout,
                    "backend": self.backend,
                    "bucket_mb": self.bucket_bytes >> 20,
                    "adapter_dir": self.adapter_dir,
                }
                self.collective_rpc("grpokit_join", json.dumps(settings))
                self._joined = True
            (result,) = self.collective_rpc("grpokit_apply", str(after_step))
        except urllib.error.URLError as e:  # not up yet (or restarting): the caller polls again
            if time.monotonic() - self._last_warning > 30:
                log.warning("no vLLM server at broadcast.init_args.base_url %s yet (%s)", self.base_url, e.reason)
                self._last_warning = time.monotonic()
            return None
        if result["step"] is None:
            self._joined = result.get("receiving", True)  # the trainer went away: join its next group
            return None
        self.last_applied = result  # the worker's report, with the sha256 of the tensors it received
        return WeightUpdate(
            step=result["step"], tensors={}, lora_config=result["lora_config"], path=result["lora_path"], in_engine=True
        )

    def collective_rpc(self, method: str, *args: str) -> list:
        """Call `method` of grpokit's worker extension in every vLLM worker; their results."""
        root = self.base_url.removesuffix("/v1")
        body = json.dumps({"method": method, "args": list(args), "timeout": self.timeout}).encode()
        request = urllib.request.Request(
            f"{root}/collective_rpc", data=body, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout + 30) as response:
                return json.loads(response.read())["results"]
        except urllib.error.HTTPError as e:
            hint = (
                " (start vLLM with VLLM_SERVER_DEV_MODE=1 and --worker-extension-cls "
                + WORKER_EXTENSION
                + "; grpokit infer does)"
                if e.code == 404
                else ""
            )
            raise RuntimeError(
                f"vLLM at {root} answered {e.code} to collective_rpc {method}{hint}: {e.read()[:500]!r}"
            ) from e
