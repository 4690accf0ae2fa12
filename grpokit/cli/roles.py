"""The three roles of a run as separate processes, each from the same recipe, and a fourth for its judge:

    grpokit infer       --config r.yaml --run_name R   # engine + OpenAI-compatible server, follows the broadcast
    grpokit orchestrate --config r.yaml --run_name R   # rollouts -> rewards -> batches, via inference.base_url
    grpokit train       --config r.yaml --run_name R   # Lightning trainer: batches -> weights
    grpokit judge       --config r.yaml                # the judge's model at its judge.base_url (cli/judge_role.py)

They share only `{output_dir}/{run_name}/` (filesystem transport and broadcast) or sockets (ZMQ).
Any start order works: the trainer waits for batches, the orchestrator for weights and the servers.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from dataclasses import dataclass, field, replace

from grpokit.inference import InferenceEngine
from grpokit.inference.builtin import BuiltinEngine
from grpokit.inference.server.limits import ServerLimits
from grpokit.inference.vllm.launch import start_recipe_vllm
from grpokit.orchestrator.kl_reward import warn_if_loss_has_kl
from grpokit.orchestrator.weights import weight_source
from grpokit.run import start_engine

log = logging.getLogger(__name__)


@dataclass
class ServerSettings:
    """`grpokit infer`: where the OpenAI-compatible server listens and what it serves.

    Args:
        host: bind address; loopback unless you mean to expose the server.
        port: TCP port.
        model_name: the served model name (the `model` field clients send).
        engine: the engine behind the server (default: the builtin torch engine). With `inference:
            VLLMEngine` and its `serve` set, `grpokit infer` runs vLLM's server here instead, and so
            does `grpokit fit`, for the length of the run.
        limits: what one request may cost (n, rows, body bytes, prompt tokens), the request queue, read
            and shutdown timeouts, request-supplied chat templates (grpokit's server only; ServerLimits).
        allowed_hosts: the Host names answered; null = the loopback names when `host` is a loopback
            address (a DNS-rebinding page gets 403), any name otherwise; ["*"] = any.
        allowed_origins: web origins whose requests are answered (a request with any other `Origin`
            header gets 403: a page the user visits may not drive the server); ["*"] = any.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str = "grpokit"
    engine: InferenceEngine | None = None
    limits: ServerLimits = field(default_factory=ServerLimits)
    allowed_hosts: list[str] | None = None
    allowed_origins: list[str] = field(default_factory=list)


def infer(cli) -> int:
    """Serve the recipe's model, loading each newly published step from the run's broadcast."""

    from grpokit.inference.server.http import make_app, make_server  # starlette + uvicorn: `infer` only

    config = cli.config_init
    settings: ServerSettings = config["server"]
    if getattr(config["inference"], "serve", None) is not None:  # VLLMEngine with `serve`: vLLM is the server
        return infer_vllm(cli, config["inference"], settings)
    engine = settings.engine or BuiltinEngine()
    broadcast = config["broadcast"]
    tokenizer = start_engine(engine, broadcast, cli.model, cli.run.run_dir)
    signal.signal(signal.SIGTERM, interrupt)  # until serving: then uvicorn stops gracefully and re-raises it
    app = make_app(engine, tokenizer, settings.model_name, broadcast, limits=settings.limits)
    app.run_name = cli.run.run_dir.name  # an orchestrator of another run refuses this server (RemoteEngine)
    try:
        server = make_server(app, settings.host, settings.port, settings.allowed_hosts, settings.allowed_origins)
        log.info("serving %s on %s:%d for run %s", cli.model.model_name, settings.host, settings.port, cli.run.run_dir)
        try:
            server.serve_forever()
        finally:
            server.close()  # the engine thread: queued requests answered 503, the running one shutdown_timeout
    except KeyboardInterrupt:
        log.info("server stopped")
    finally:
        broadcast.close()  # stops the NCCL receiver, withdraws the filesystem broadcast's ack
    if app.worker.thread.is_alive():
        log.warning("the engine is still sampling a request; exiting without waiting for it")
    exit_now(0)


def exit_now(code: int) -> None:
    """End the process at once, logs and output flushed, once the server has answered every request and
    the broadcast is closed. The engine thread may still be inside a generate that cannot be interrupted,
    and torch aborts (std::terminate) when the process is finalised under a running op. Even when it has
    ended, the interpreter's teardown of torch and transformers adds a second or more (two under load) to
    the promise that SIGTERM stops the server within a few seconds; nothing left needs it."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def infer_vllm(cli, engine, settings: ServerSettings) -> int:
    """Run vLLM's server (inference.init_args.serve) on server.host:server.port until SIGTERM or Ctrl-C.

    The orchestrator's VLLMEngine hot-loads each step's adapter into it (or, with `broadcast:
    VLLMNCCLBroadcast`, has vLLM's worker, extended by grpokit.inference.vllm.worker, receive the weights);
    this process only keeps the server up, forwards the stop signal and reports a server that died on its
    own (its exit code).
    """

    signal.signal(signal.SIGTERM, interrupt)  # SIGTERM stops the server like Ctrl-C
    server = None
    try:
        server = start_recipe_vllm(cli, engine, cli.config_init["broadcast"], settings)
        code = server.wait()
        log.error("vLLM exited on its own with code %d; the end of %s:\n%s", code, server.log_path, server.log_tail())
        return code or 1
    except KeyboardInterrupt:
        log.info("stopping vLLM")
        return 0
    finally:
        if server is not None:
            server.stop(engine.serve.stop_timeout)


def interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


class Terminated(KeyboardInterrupt):
    """SIGTERM where Ctrl-C's KeyboardInterrupt would be: the orchestrator stops the same way, and exits
    143 (128 + SIGTERM), not 130, so a scheduler sees which signal ended it."""


def _terminate(signum, frame) -> None:
    raise Terminated


def orchestrate(cli) -> int:
    """Produce the batches of every step in this process (the engine is the recipe's `inference`)."""
    config = cli.config_init
    engine: InferenceEngine = config["inference"]
    broadcast = config["broadcast"]
    data = cli.datamodule
    tokenizer = start_engine(engine, broadcast, cli.model, cli.run.run_dir, data)
    published = weight_source(engine, broadcast).poll(-1)  # the trainer's progress: the weights of its current step
    start = max(cli.run.start_step, published.step if published else 0)
    loop = data.connect(
        engine,
        broadcast,
        tokenizer,
        replace(cli.run, start_step=start),
        cli.trainer.max_steps,
        reference_model=cli.model.model_name,  # data.kl_in_reward's reference: the initial policy
    )
    warn_if_loss_has_kl(data.settings.kl_in_reward, cli.model.loss)
    loop.announce = True  # each batch sent, and a long wait for the trainer's weights, on stderr
    first = first_unsent_step(data, start)
    log.info("orchestrating run %s from step %d to %d", cli.run.run_dir, first, cli.trainer.max_steps)
    signal.signal(signal.SIGTERM, _terminate)  # SIGTERM stops it like Ctrl-C: batch files are written whole
    try:
        loop.run(first)
        log.info("every batch up to step %d sent", cli.trainer.max_steps - 1)
        return 0
    except KeyboardInterrupt as e:
        log.info("orchestrator stopped; the same command continues from the first batch not yet sent")
        return 143 if isinstance(e, Terminated) else 130
    finally:
        try:
            data.transport.close()
        finally:
            broadcast.close()  # withdraws its filesystem-broadcast ack, which would keep old weight steps on disk


def first_unsent_step(data, start_step: int) -> int:
    """Where a (re)started orchestrator begins: the first step whose batch the transport does not hold."""
    step = start_step
    while data.transport.has(step):
        step += 1
    return step
