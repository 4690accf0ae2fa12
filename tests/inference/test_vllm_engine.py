"""VLLMEngine against a stub of vLLM's HTTP API: adapter load/unload requests, model names, weight steps.

The real server is exercised in tests/integration/test_vllm_cpu.py (needs the vLLM venv).
"""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from grpokit.broadcast.filesystem import FilesystemBroadcast
from grpokit.inference import SamplingSettings
from grpokit.inference.streams import GroupRequest
from grpokit.inference.vllm.engine import VLLMEngine
from grpokit.types import WeightUpdate


class StubVLLM(BaseHTTPRequestHandler):
    """Answers like vLLM 0.32: plain-text adapter routes, completions that echo the adapter name and carry no
    weight_step."""

    calls: list[tuple[str, dict]] = []
    hold: dict[str, threading.Event] = {}  # completions for these adapter names wait until set

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.calls.append((self.path, body))
        if self.path.endswith("/completions"):
            if (gate := self.hold.get(body["model"])) is not None:
                assert gate.wait(timeout=30)
            choices = [
                {
                    "index": i,
                    "token_ids": [5, 6],
                    "logprobs": {"token_logprobs": [-1.0, -2.0]},
                    "finish_reason": "length",
                }
                for i in range(body["n"])
            ]
            payload = json.dumps({"model": body["model"], "choices": choices}).encode()
        else:
            payload = b"Success"
        self.send_response(200)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def stub_url():
    StubVLLM.calls, StubVLLM.hold = [], {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), StubVLLM)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/v1"
    server.shutdown()


def adapter_update(tmp_path, step: int) -> WeightUpdate:
    broadcast = FilesystemBroadcast()
    broadcast.setup(tmp_path)
    broadcast.publish(WeightUpdate(step=step, tensors={"a.lora_A.weight": torch.zeros(2, 2)}, lora_config={"r": 2}))
    return broadcast.read(step)


def test_hot_loads_each_step_and_names_it_in_requests(tmp_path, stub_url):
    engine = VLLMEngine(stub_url, model_name="base")
    engine.setup("unused")
    sampling = SamplingSettings(max_tokens=2)
    [[before]] = engine.generate([[1, 2]], 1, sampling)
    assert before.policy_step == 0  # the base model name: the zero adapter of step 0
    engine.load_weights(adapter_update(tmp_path, 1))
    engine.load_weights(adapter_update(tmp_path, 2))
    [[a, b]] = engine.generate([[1, 2]], 2, sampling)
    assert (a.policy_step, b.policy_step, engine.weight_step) == (2, 2, 2)
    assert a.token_ids == [5, 6] and a.logprobs == [-1.0, -2.0]
    routes = [(path, body.get("lora_name") or body.get("model")) for path, body in StubVLLM.calls]
    assert routes == [
        ("/v1/completions", "base"),
        ("/v1/load_lora_adapter", "step_1"),
        ("/v1/load_lora_adapter", "step_2"),
        ("/v1/unload_lora_adapter", "step_1"),
        ("/v1/completions", "step_2"),
    ]
    load = StubVLLM.calls[2][1]
    assert load["lora_path"] == str(tmp_path / "broadcasts" / "step_2") and load["load_inplace"] is True


def test_refuses_full_weights_and_updates_without_a_folder(stub_url):
    engine = VLLMEngine(stub_url)
    engine.setup("unused")
    with pytest.raises(ValueError, match="LoRA adapters only.*NCCL"):
        engine.load_weights(WeightUpdate(step=1, tensors={"w": torch.zeros(1)}))
    with pytest.raises(ValueError, match="FilesystemBroadcast"):
        engine.load_weights(WeightUpdate(step=1, tensors={}, lora_config={"r": 2}))
    assert StubVLLM.calls == []


def test_a_stream_loads_weights_while_requests_run_on_the_adapter_they_were_sent_with(tmp_path, stub_url):
    """Streaming with `on_update: finish` (tests/inference/test_interrupting.py has the default, which
    continues them on the new adapter): a group's request sent with step 1's adapter is still running
    when step 2 loads. Step 1
    stays loaded until that request is answered (with step 1), then it is unloaded; a group sent after
    the load samples with step 2."""
    engine = VLLMEngine(stub_url, model_name="base")
    engine.setup("unused")
    engine.load_weights(adapter_update(tmp_path, 1))
    StubVLLM.hold["step_1"] = threading.Event()
    stream = engine.open_stream(SamplingSettings(max_tokens=2), max_rows=8, on_update="finish")
    stream.submit(GroupRequest("early", [1, 2], 2))
    assert stream.advance() == []  # held by the server
    engine.load_weights(adapter_update(tmp_path / "b", 2))
    stream.submit(GroupRequest("late", [3], 2))
    [late] = drain_until(stream, 1)
    assert late.request.key == "late" and [c.policy_step for c in late.completions] == [2, 2]
    routes = [(path.removeprefix("/v1/"), body.get("lora_name") or body.get("model")) for path, body in StubVLLM.calls]
    assert ("unload_lora_adapter", "step_1") not in routes  # its request still runs
    StubVLLM.hold["step_1"].set()
    [early] = drain_until(stream, 1)
    assert early.request.key == "early" and [c.policy_step for c in early.completions] == [1, 1]
    routes = [(path.removeprefix("/v1/"), body.get("lora_name") or body.get("model")) for path, body in StubVLLM.calls]
    assert routes[-1] == ("unload_lora_adapter", "step_1")  # by the answer of its last request
    assert routes.count(("unload_lora_adapter", "step_1")) == 1
    stream.close()


def drain_until(stream, count: int, timeout: float = 30.0) -> list:
    deadline, out = time.monotonic() + timeout, []
    while len(out) < count:
        assert time.monotonic() < deadline, f"{len(out)} of {count} groups in {timeout} s"
        out += stream.advance()
    return out


def test_closing_a_stream_waits_for_its_requests_in_flight(tmp_path, stub_url):
    """At a run's end the stream's requests in flight are waited for (bounded), not left to run on
    while `grpokit fit` stops the server under them."""
    engine = VLLMEngine(stub_url, model_name="base")
    engine.setup("unused")
    StubVLLM.hold["base"] = gate = threading.Event()
    stream = engine.open_stream(SamplingSettings(max_tokens=2), max_rows=8, on_update="finish")
    stream.submit(GroupRequest("ahead", [1, 2], 2))
    assert stream.advance() == []
    threading.Timer(0.3, gate.set).start()
    start = time.monotonic()
    [future] = list(stream.running)
    stream.close(wait=10.0)
    assert future.done() and 0.2 < time.monotonic() - start < 5.0
    stream.submit(GroupRequest("never", [3], 1))
    stream.close(wait=0.0)  # nothing in flight: returns at once, the queued group dropped
    assert stream.inflight == 0
