"""The vLLM server launcher (grpokit.inference.vllm.server): the command line built from the recipe, its
refusals, the recipe keys parsing into VLLMEngine's `serve`, and the process handling (start, readiness,
stop of the whole process group) on a stand-in server. The real vLLM launch is in
tests/integration/test_vllm_cpu.py (needs the vLLM venv)."""

import os
import signal
import socket
import sys
import time

import pytest

from grpokit.inference.vllm.server import VLLMServe, VLLMServer, lora_rank_for_vllm, serve_command, serve_env
from grpokit.testing import tiny_fit_argv
from tests.support import process_group_gone


def flag(command: list[str], name: str) -> str | None:
    return command[command.index(name) + 1] if name in command else None


def test_command_carries_the_recipe_options():
    serve = VLLMServe(
        tensor_parallel_size=2,
        data_parallel_size=4,
        max_model_len=4096,
        enforce_eager=True,
        extra_args=["--max-num-seqs", "64"],
    )
    cmd = serve_command(
        serve, "/models/qwen", "base", "0.0.0.0", 8001, "bfloat16", lora_rank=12, gpu_memory_utilization=0.55
    )
    assert cmd[:2] == ["vllm", "serve"]
    expected = {
        "--model": "/models/qwen",
        "--served-model-name": "base",
        "--host": "0.0.0.0",
        "--port": "8001",
        "--dtype": "bfloat16",
        "--tensor-parallel-size": "2",
        "--data-parallel-size": "4",
        "--max-model-len": "4096",
        "--max-lora-rank": "16",
        "--max-loras": "2",
        "--gpu-memory-utilization": "0.55",
    }
    assert {k: flag(cmd, k) for k in expected} == expected
    assert "--enable-lora" in cmd and "--enforce-eager" in cmd and "--worker-extension-cls" not in cmd
    assert cmd[-2:] == ["--max-num-seqs", "64"]  # extra arguments last, so they win


def test_defaults_follow_the_recipe_and_explicit_values_win():
    cmd = serve_command(VLLMServe(), "m", "base", "127.0.0.1", 8000, "float32", lora_rank=None)
    assert "--enable-lora" not in cmd and "--gpu-memory-utilization" not in cmd and "--max-model-len" not in cmd
    assert flag(cmd, "--dtype") == "float32"
    explicit = VLLMServe(gpu_memory_utilization=0.3, dtype="bfloat16", max_lora_rank=64)
    cmd = serve_command(explicit, "m", "base", "127.0.0.1", 8000, "float32", lora_rank=16, gpu_memory_utilization=0.8)
    assert (flag(cmd, "--gpu-memory-utilization"), flag(cmd, "--dtype"), flag(cmd, "--max-lora-rank")) == (
        "0.3",
        "bfloat16",
        "64",
    )
    assert "--enable-lora" not in serve_command(VLLMServe(enable_lora=False), "m", "b", "h", 1, "float32", lora_rank=8)
    cmd = serve_command(
        VLLMServe(),
        "m",
        "b",
        "h",
        1,
        "float32",
        None,
        worker_extension="grpokit.inference.vllm.worker.NCCLWeightReceiver",
    )
    assert flag(cmd, "--worker-extension-cls") == "grpokit.inference.vllm.worker.NCCLWeightReceiver"


def test_max_images_becomes_vllms_per_prompt_image_limit_as_json():
    """data.pixel_budget.max_images -> `--limit-mm-per-prompt {"image": N}` (vLLM 0.32 parses the JSON into
    {"image": N}); without it vLLM's default stays; extra_args setting the flag (any form) win alone."""
    cmd = serve_command(VLLMServe(extra_args=["--max-num-seqs", "8"]), "m", "b", "h", 1, "float32", None, max_images=2)
    assert flag(cmd, "--limit-mm-per-prompt") == '{"image": 2}' and cmd.count("--limit-mm-per-prompt") == 1
    assert cmd[-2:] == ["--max-num-seqs", "8"]  # extra arguments still last
    unlimited = serve_command(VLLMServe(), "m", "b", "h", 1, "float32", None)
    assert not any(a.startswith("--limit-mm-per-prompt") for a in unlimited)
    for own in (["--limit-mm-per-prompt", '{"image": 5}'], ['--limit-mm-per-prompt={"image": 5}'],
                ["--limit-mm-per-prompt.image", "5"]):  # fmt: skip
        cmd = serve_command(VLLMServe(extra_args=own), "m", "b", "h", 1, "float32", None, max_images=2)
        assert [a for a in cmd if a.startswith("--limit-mm-per-prompt")] == own[:1] and '{"image": 2}' not in cmd


def test_lora_rank_rounds_up_to_one_vllm_accepts():
    assert [lora_rank_for_vllm(r) for r in (1, 2, 8, 9, 16, 100, 512)] == [1, 8, 8, 16, 16, 128, 512]
    with pytest.raises(ValueError, match="exceeds vLLM's largest"):
        lora_rank_for_vllm(1024)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"command": []}, "serve.command"),
        ({"max_loras": 1}, "serve.max_loras must be >= 2"),
        ({"gpu_memory_utilization": 1.5}, r"gpu_memory_utilization must be in \(0, 1\]"),
        ({"max_lora_rank": 12}, "max_lora_rank must be one of"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
    ],
)
def test_bad_settings_name_the_key(kwargs, match):
    with pytest.raises(ValueError, match=match):
        VLLMServe(**kwargs)


def test_refuses_a_max_lora_rank_below_the_adapters_rank():
    with pytest.raises(ValueError, match="below model.lora.rank 32"):
        serve_command(VLLMServe(max_lora_rank=16), "m", "b", "h", 1, "float32", lora_rank=32)
    with pytest.raises(ValueError, match="model.lora is unset"):
        serve_command(VLLMServe(enable_lora=True), "m", "b", "h", 1, "float32", lora_rank=None)


def test_env_turns_on_runtime_lora_loading_and_adds_serve_env(monkeypatch):
    monkeypatch.delenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", raising=False)
    env = serve_env(VLLMServe(env={"VLLM_CPU_KVCACHE_SPACE": "1"}), lora=True)
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True" and env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in serve_env(VLLMServe(), lora=False)


def test_recipe_keys_parse_into_the_engines_serve(tmp_path, tiny_model):
    from grpokit.cli import make_cli

    argv = tiny_fit_argv(
        tmp_path,
        tiny_model,
        "p",
        "--inference",
        "VLLMEngine",
        "--inference.init_args.serve.tensor_parallel_size",
        "2",
        "--inference.init_args.serve.extra_args",
        '["--max-num-seqs", "8"]',
        "--inference.init_args.serve.colocate",
        "true",
        command="fit",
    )[1:]
    engine = make_cli(argv, run=False, role="infer").config_init["inference"]
    assert (engine.serve.tensor_parallel_size, engine.serve.extra_args, engine.serve.colocate) == (
        2,
        ["--max-num-seqs", "8"],
        True,
    )


STAND_IN = """
import http.server, os, signal, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # a worker in the same process group
if sys.argv[2] == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
class Models(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b'{"data": [{"id": "stand-in"}]}')
    def log_message(self, *a): pass
time.sleep(1.0)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Models).serve_forever()
"""


@pytest.mark.parametrize("mode", ["graceful", "ignore-term"])
def test_server_process_starts_serves_and_stops_with_its_workers(tmp_path, mode):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = VLLMServer(
        [sys.executable, "-c", STAND_IN, str(port), mode],
        {},
        f"http://127.0.0.1:{port}/v1",
        "stand-in",
        tmp_path / "log",
    )
    server.start()
    assert server.wait_ready(timeout=30) >= 0
    assert server.serves()
    start = time.monotonic()
    code = server.stop(timeout=1.0)
    assert code == (-signal.SIGTERM if mode == "graceful" else -signal.SIGKILL)
    assert time.monotonic() - start < 10
    assert process_group_gone(server.process.pid, within=10.0)  # the worker went with it


def test_a_server_that_dies_while_starting_reports_its_log(tmp_path):
    server = VLLMServer(
        [sys.executable, "-c", "print('bad flag --foo'); raise SystemExit(2)"],
        {},
        "http://127.0.0.1:9/v1",
        "x",
        tmp_path / "log",
    )
    server.start()
    with pytest.raises(RuntimeError, match=r"(?s)exited with code 2 while starting.*bad flag --foo"):
        server.wait_ready(timeout=30)


def test_a_missing_vllm_program_names_serve_command(tmp_path):
    server = VLLMServer(
        ["no-such-vllm-program", "serve"], {"PATH": os.defpath}, "http://127.0.0.1:9/v1", "x", tmp_path / "log"
    )
    with pytest.raises(
        FileNotFoundError,
        match=r"cannot start vLLM: 'no-such-vllm-program' \(No such file or "
        r"directory\)\. Install vLLM .* set inference.init_args.serve.command",
    ):
        server.start()
