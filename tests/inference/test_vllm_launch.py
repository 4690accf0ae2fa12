"""`grpokit fit` starting vLLM itself (grpokit.inference.vllm.launch), on a stand-in for vLLM's server: a
small HTTP server started by the real launcher with the real command line, answering /v1/models,
completions (fixed tokens, echoing the requested model as vLLM does) and the LoRA adapter endpoints.
The server is up for the run, the engine samples from it, and it and its worker are gone when fit
ends, fails, or never gets going. The real vLLM is in tests/integration/test_vllm_cpu.py."""

import json
import os
import signal
import socket
import sys

import pytest

from grpokit.inference.vllm.engine import VLLMEngine
from grpokit.inference.vllm.launch import _sigterm_interrupts, start_for_fit
from grpokit.inference.vllm.server import VLLMServe, check_port_free
from grpokit.testing import free_port, tiny_fit_argv
from tests.support import process_group_gone

STAND_IN = """
import http.server, json, os, subprocess, sys
args, record = sys.argv[2:], open(sys.argv[1], "a", buffering=1)
def note(**fields): record.write(json.dumps(fields) + "\\n")
note(event="start", pid=os.getpid(), argv=args, lora_updating=os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING"),
     dev_mode=os.environ.get("VLLM_SERVER_DEV_MODE"))
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # an engine-core worker in its group
served, fail = args[args.index("--served-model-name") + 1], os.environ.get("STAND_IN_MODE") == "fail"
class Handler(http.server.BaseHTTPRequestHandler):
    def answer(self, body, code=200):
        self.send_response(code); self.end_headers(); self.wfile.write(json.dumps(body).encode())
    def do_GET(self):
        self.answer({"data": [{"id": served}]})
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        note(event=self.path, model=body.get("model"), lora_name=body.get("lora_name"), lora_path=body.get("lora_path"))
        if self.path != "/v1/completions":
            return self.answer({})
        if fail:
            return self.answer({"error": "the stand-in refuses"}, 400)
        k = body["max_tokens"]
        choices = [{"index": i, "token_ids": list(range(20, 20 + k)), "logprobs": {"token_logprobs": [-1.0] * k},
                    "finish_reason": "length"} for i in range(body["n"])]
        self.answer({"model": body["model"], "choices": choices})
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(args[args.index("--port") + 1])), Handler).serve_forever()
"""


def fit_argv(tmp_path, tiny_model, port: int, *extra: str) -> list[str]:
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    return tiny_fit_argv(
        tmp_path,
        tiny_model,
        "run",
        "--trainer.max_steps",
        "2",
        "--ckpt.interval",
        "0",
        "--data.eval",
        "null",
        "--data.max_async_level",
        "0",
        "--server.port",
        str(port),
        "--inference",
        "VLLMEngine",
        "--inference.init_args.model_name",
        "stand-in",
        "--inference.init_args.max_retries",
        "0",
        "--inference.init_args.serve.command",
        json.dumps([sys.executable, str(script), str(tmp_path / "record.jsonl")]),
        *extra,
    )


def records(tmp_path) -> list[dict]:
    return [json.loads(line) for line in open(tmp_path / "record.jsonl")]


def test_fit_starts_vllm_samples_from_it_and_stops_it(tmp_path, tiny_model):
    from grpokit.cli import make_cli

    port = free_port()
    make_cli(fit_argv(tmp_path, tiny_model, port))
    start, *requests = records(tmp_path)
    argv = start["argv"]
    assert (
        argv[argv.index("--port") + 1] == str(port) and argv[argv.index("--max-lora-rank") + 1] == "8"
    )  # server.port; rank 4 rounded up
    assert start["lora_updating"] == "True"
    completions = [r for r in requests if r["event"] == "/v1/completions"]
    assert {r["model"] for r in completions} == {"step_0", "step_1"}  # each step's adapter, hot-loaded
    loads = [r for r in requests if r["event"] == "/v1/load_lora_adapter"]
    assert [r["lora_name"] for r in loads] == ["step_0", "step_1"]
    assert all(r["lora_path"].startswith(str(tmp_path / "run" / "broadcasts")) for r in loads)
    assert process_group_gone(start["pid"], within=10.0)  # the server and its worker
    check_port_free("127.0.0.1", port)  # nothing listens there any more


def test_a_failing_fit_stops_vllm(tmp_path, tiny_model):
    from grpokit.cli import make_cli

    argv = fit_argv(tmp_path, tiny_model, free_port(), "--inference.init_args.serve.env", '{"STAND_IN_MODE": "fail"}')
    with pytest.raises(RuntimeError, match="orchestrator failed.*answered 400"):
        make_cli(argv)
    start = records(tmp_path)[0]
    assert process_group_gone(start["pid"], within=10.0)


def test_with_vllm_nccl_broadcast_the_worker_extension_is_loaded_and_the_broadcast_pointed_at_the_server(
    tmp_path, tiny_model
):
    from grpokit.broadcast.vllm_nccl import WORKER_EXTENSION
    from grpokit.cli import make_cli

    port = free_port()
    argv = fit_argv(
        tmp_path,
        tiny_model,
        port,
        "--model.lora",
        "null",
        "--broadcast",
        "VLLMNCCLBroadcast",
        "--broadcast.init_args.backend",
        "gloo",
    )
    cli = make_cli(argv[1:], run=False, role="infer")  # parse and build only
    engine, broadcast = cli.config_init["inference"], cli.config_init["broadcast"]
    stopper = start_for_fit(cli, engine, broadcast, cli.config_init["server"])
    try:
        url = f"http://127.0.0.1:{port}/v1"
        assert engine.base_urls == [url] and broadcast.base_url == url  # not the recipe's default port 8000
        start = records(tmp_path)[0]
        assert (
            start["argv"][start["argv"].index("--worker-extension-cls") + 1] == WORKER_EXTENSION
            and start["dev_mode"] == "1"
        )
        assert "--enable-lora" not in start["argv"]  # full fine-tuning
    finally:
        stopper.stop()
    stopper.stop()  # a second stop (teardown after on_exception) does nothing
    assert process_group_gone(start["pid"], within=10.0)


@pytest.mark.parametrize(
    "model, budget, limit",
    [
        ("qwen", '{"max_images": 2}', '{"image": 2}'),
        ("qwen", '{"max_pixels": 3136}', None),  # no max_images: vLLM's own default
        ("text", '{"max_images": 2}', None),  # a text model takes no image flags
    ],
    ids=["vlm-max-images", "vlm-no-limit", "text-model"],
)
def test_pixel_budget_max_images_limits_a_vision_language_models_server(tmp_path, tiny_model, model, budget, limit):
    """The real launcher's command line, as the stand-in received it: a vision-language model's server gets
    `--enable-scale-out` and, with data.pixel_budget.max_images, `--limit-mm-per-prompt {"image": N}`."""
    from grpokit.cli import make_cli
    from grpokit.testing import build_tiny_qwen2_5_vl

    path = str(build_tiny_qwen2_5_vl(tmp_path / "qwen")) if model == "qwen" else tiny_model
    cli = make_cli(fit_argv(tmp_path, path, free_port(), "--data.pixel_budget", budget)[1:], run=False, role="infer")
    stopper = start_for_fit(cli, cli.config_init["inference"], cli.config_init["broadcast"], cli.config_init["server"])
    try:
        start = records(tmp_path)[0]
    finally:
        stopper.stop()
    argv = start["argv"]
    assert (argv[argv.index("--limit-mm-per-prompt") + 1] if "--limit-mm-per-prompt" in argv else None) == limit
    assert ("--enable-scale-out" in argv) == (model == "qwen")
    assert process_group_gone(start["pid"], within=10.0)


def test_fit_refuses_a_port_in_use_before_starting_anything(tmp_path, tiny_model):
    from grpokit.cli import make_cli

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(
            RuntimeError, match=r"server.host:server.port 127.0.0.1:\d+ is taken .*set server.port to a free port"
        ):
            make_cli(fit_argv(tmp_path, tiny_model, taken.getsockname()[1]))
    assert not (tmp_path / "record.jsonl").exists()


def test_fit_refuses_several_base_urls_with_serve():
    engine = VLLMEngine(["http://a:8000/v1", "http://b:8000/v1"], serve=VLLMServe())
    with pytest.raises(ValueError, match="inference.init_args.base_url lists 2"):
        start_for_fit(None, engine, None, None)
    assert start_for_fit(None, VLLMEngine(), None, None) is None  # no `serve`: a server started elsewhere


def test_sigterm_while_starting_interrupts_and_the_handler_is_restored():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), _sigterm_interrupts():
        os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is before
