"""The recipe's vLLM server (VLLMEngine's `serve`), as `grpokit infer` and `grpokit fit` start it.

Both start it the same way (grpokit.inference.vllm.server.start_vllm): on `server.host:server.port`,
with the broadcast's worker extension when it has one (`VLLMNCCLBroadcast`), refusing a port that
something already listens on, and waiting until `/v1/models` lists the served model. SIGTERM while it
starts stops it like Ctrl-C (SIGTERM to vLLM, SIGKILL to its process group after `stop_timeout`).

`grpokit infer` then keeps it up until stopped (grpokit.cli.roles.infer_vllm). `grpokit fit` keeps it for
the run: global rank 0 starts it, points its VLLMEngine (and a VLLMNCCLBroadcast) at it, and the
StopVLLM callback stops it when fit ends, fails or is interrupted. If grpokit itself is killed, Linux
sends vLLM SIGTERM (vllm_server's death signal), so no server outlives the run.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading

import lightning as L
import torch

from grpokit.inference.vllm.server import VLLMServer, start_vllm

log = logging.getLogger(__name__)


def start_recipe_vllm(cli, engine, broadcast, settings) -> VLLMServer:
    """Start vLLM for the recipe: engine.serve's options, the Policy's model, dtype and LoRA rank, on
    settings.host:settings.port (ServerSettings), with the broadcast's vLLM worker extension if any, and
    data.pixel_budget.max_images as a vision-language model's per-prompt image limit."""
    extension = getattr(broadcast, "vllm_worker_extension", None)  # VLLMNCCLBroadcast's receiver
    data = cli.datamodule.settings
    with _sigterm_interrupts():
        return start_vllm(
            engine.serve,
            cli.model,
            data.seq_len,
            settings.host,
            settings.port,
            engine.base_model_name,
            cli.run.run_dir,
            extension,
            data.pixel_budget.max_images if data.pixel_budget is not None else None,
        )


def start_for_fit(cli, engine, broadcast, settings) -> StopVLLM | None:
    """`grpokit fit` with `inference: VLLMEngine` and its `serve` set: start vLLM, point the engine (and a
    VLLMNCCLBroadcast) at it; returns the callback that stops it. None when the engine has no `serve`."""
    serve = getattr(engine, "serve", None)
    if serve is None:
        return None
    if len(engine.base_urls) > 1:
        raise ValueError(
            f"grpokit fit starts one vLLM server (inference.init_args.serve) but inference.init_args.base_url lists "
            f"{len(engine.base_urls)}: for more replicas set serve.data_parallel_size; to sample from servers started "
            "elsewhere, set serve to null"
        )
    if torch.cuda.is_available() and not serve.colocate and serve.gpu_memory_utilization is None:
        log.warning(
            "vLLM takes its default share of the GPUs the trainer of `grpokit fit` may "
            "use: set inference.init_args.serve.colocate true (or gpu_memory_utilization)"
        )
    server = start_recipe_vllm(cli, engine, broadcast, settings)
    point_at(engine, broadcast, server.url)
    return StopVLLM(server, serve.stop_timeout)


def point_at(engine, broadcast, url: str) -> None:
    """Make the engine (and a broadcast into vLLM's worker) talk to the server at `url` (ending in /v1)."""
    if engine.base_urls != [url]:
        log.info(
            "grpokit fit samples from the vLLM server it started at %s (not inference.init_args.base_url %s)",
            url,
            engine.base_urls[0],
        )
    engine.base_urls = [url]
    if getattr(broadcast, "vllm_worker_extension", None) is not None:
        if broadcast.base_url != url:
            log.info(
                "broadcast.init_args.base_url %s replaced by the vLLM server fit started, %s", broadcast.base_url, url
            )
        broadcast.base_url = url


class StopVLLM(L.Callback):
    """Stops `grpokit fit`'s vLLM server when fit ends (teardown: after WeightSync's last publish, which
    a VLLMNCCLBroadcast sends into the server), fails or is interrupted (on_exception: errors, Ctrl-C,
    and Lightning's SIGTERMException). A server that died during the run has its log's end reported."""

    def __init__(self, server: VLLMServer, timeout: float) -> None:
        self.server, self.timeout = server, timeout

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.stop()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if self.server is not None and self.server.process.poll() is not None:
            log.error(
                "vLLM exited during the run with code %d; the end of %s:\n%s",
                self.server.process.returncode,
                self.server.log_path,
                self.server.log_tail(),
            )
        self.stop()

    def stop(self) -> None:
        """Stop the server (once: a second call does nothing)."""
        server, self.server = self.server, None
        if server is not None:
            log.info("vLLM stopped (exit code %s)", server.stop(self.timeout))


@contextlib.contextmanager
def _sigterm_interrupts():
    """SIGTERM raises KeyboardInterrupt inside (main thread only), so a server being started is stopped."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt
