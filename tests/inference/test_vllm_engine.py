"""VLLMEngine against a stub of vLLM's HTTP API: adapter load/unload requests, model names, weight steps,
the adapters' pinned files, and a stream's continuation after an update (prompt + tokens so far, the
rest of the budget, the new adapter, no seed).

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
from tests.support import drain, wait_until
from tests.support.servers import JsonStub, stub_server


class StubVLLM(JsonStub):
    """Answers like vLLM 0.32: plain-text adapter routes, completions that echo the adapter name and carry no
    weight_step."""

    calls: list[tuple[str, dict]] = []
    hold: dict[str, threading.Event] = {}  # completions for these adapter names wait until set

    def answer(self, path: str, body: dict) -> tuple[int, bytes]:
        self.calls.append((path, body))
        if not path.endswith("/completions"):
            return 200, b"Success"
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
        return 200, json.dumps({"model": body["model"], "choices": choices}).encode()


@pytest.fixture
def stub_url():
    StubVLLM.calls, StubVLLM.hold = [], {}
    with stub_server(StubVLLM) as url:
        yield url


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
    pinned = tmp_path / "broadcasts" / "pinned"
    assert load["lora_path"] == str(pinned / "step_2") and load["load_inplace"] is True
    published = tmp_path / "broadcasts" / "step_2" / "adapter_model.safetensors"
    assert (pinned / "step_2" / published.name).stat().st_ino == published.stat().st_ino  # a hard link
    assert (pinned / "step_1").exists()  # unloaded, kept PIN_GRACE_S for the aborts vLLM has yet to process


def test_refuses_full_weights_and_updates_without_a_folder(stub_url):
    engine = VLLMEngine(stub_url)
    engine.setup("unused")
    with pytest.raises(ValueError, match="LoRA adapters only.*NCCL"):
        engine.load_weights(WeightUpdate(step=1, tensors={"w": torch.zeros(1)}))
    with pytest.raises(ValueError, match="FilesystemBroadcast"):
        engine.load_weights(WeightUpdate(step=1, tensors={}, lora_config={"r": 2}))
    assert StubVLLM.calls == []


def held_on_step_1(tmp_path, stub_url) -> tuple[VLLMEngine, object]:
    """VLLMEngine on step 1's adapter with an `on_update: finish` stream whose group "early" the stub
    holds (until StubVLLM.hold["step_1"] is set)."""
    engine = VLLMEngine(stub_url, model_name="base")
    engine.setup("unused")
    engine.load_weights(adapter_update(tmp_path, 1))
    StubVLLM.hold["step_1"] = threading.Event()
    stream = engine.open_stream(SamplingSettings(max_tokens=2), max_rows=8, on_update="finish")
    stream.submit(GroupRequest("early", [1, 2], 2))
    assert stream.advance() == []  # held by the server
    return engine, stream


def test_a_stream_loads_weights_while_requests_run_on_the_adapter_they_were_sent_with(tmp_path, stub_url):
    """Streaming with `on_update: finish` (the default continues them on the new adapter: the last test
    here): a group's request sent with step 1's adapter is still running when step 2 loads. Step 1 stays
    loaded until that request is answered (with step 1), then it is unloaded; a group sent after the
    load samples with step 2."""
    engine, stream = held_on_step_1(tmp_path, stub_url)
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


def test_an_adapter_in_use_keeps_its_files_when_the_broadcast_deletes_its_step(tmp_path, stub_url, monkeypatch):
    """vLLM reloads an evicted adapter from its folder, and the broadcast deletes a step once newer ones
    are acknowledged: the folder vLLM got (hard links) outlives the step's, until PIN_GRACE_S after the
    adapter's unload (0 here: the next load deletes it)."""
    import shutil

    monkeypatch.setattr("grpokit.inference.vllm.engine.PIN_GRACE_S", 0.0)
    engine, stream = held_on_step_1(tmp_path, stub_url)
    for step in (2, 3):
        engine.load_weights(adapter_update(tmp_path, step))
    shutil.rmtree(tmp_path / "broadcasts" / "step_1")  # as the broadcast's retention does
    [path] = [b["lora_path"] for p, b in StubVLLM.calls if b.get("lora_name") == "step_1" and "lora_path" in b]
    assert json.loads((tmp_path / "broadcasts" / "pinned" / "step_1" / "adapter_config.json").read_text())["r"] == 2
    assert path == str(tmp_path / "broadcasts" / "pinned" / "step_1")
    StubVLLM.hold["step_1"].set()
    [early] = drain_until(stream, 1)
    assert [c.policy_step for c in early.completions] == [1, 1]
    engine.load_weights(adapter_update(tmp_path, 4))  # sweeps the folders of the adapters unloaded before
    pinned = sorted(p.name for p in (tmp_path / "broadcasts" / "pinned").iterdir())
    assert pinned == ["step_3", "step_4"]  # step_3 unloaded by that load: the next one sweeps it
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


class StreamingStubVLLM(BaseHTTPRequestHandler):
    """vLLM 0.32's streamed completions: a chunk per token per choice, the adapter name in `model`, no
    weight_step; a chunk every 20 ms until max_tokens. Records every request and whether its client
    hung up before the end."""

    protocol_version = "HTTP/1.1"
    calls: list[tuple[str, dict]] = []
    hung_up: list[str] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.calls.append((self.path, body))
        if not self.path.endswith("/completions"):
            self.send_response(200)
            self.send_header("Content-Length", "7")
            self.end_headers()
            self.wfile.write(b"Success")
            return
        prompts = body["prompt"] if isinstance(body["prompt"][0], list) else [body["prompt"]]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for t in range(body["max_tokens"]):
                for i in range(len(prompts) * body["n"]):
                    last = t == body["max_tokens"] - 1
                    choice = {
                        "index": i,
                        "text": "x",
                        "token_ids": [100 + t],
                        "logprobs": {"token_logprobs": [-0.5]},
                        "finish_reason": "length" if last else None,
                    }
                    self.chunk(b"data: " + json.dumps({"model": body["model"], "choices": [choice]}).encode() + b"\n\n")
                time.sleep(0.02)
            self.chunk(b"data: [DONE]\n\n")
            self.chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            self.hung_up.append(body["model"])

    def chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def log_message(self, *args):
        pass


@pytest.fixture
def stub_vllm():
    StreamingStubVLLM.calls, StreamingStubVLLM.hung_up = [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), StreamingStubVLLM)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/v1"
    server.shutdown()


def test_vllm_continuations_go_to_the_new_adapter_and_the_old_one_is_unloaded(tmp_path, stub_vllm):
    engine = VLLMEngine(stub_vllm, model_name="base", max_retries=0)
    engine.setup("unused")
    engine.vocab_size = 1000
    engine.load_weights(adapter_update(tmp_path / "a", 1))
    stream = engine.open_stream(SamplingSettings(max_tokens=40, min_tokens=30, seed=2), max_rows=8)
    stream.submit(GroupRequest("g", [1, 2], 2))
    assert stream.advance() == []
    wait_until(lambda: any(p.endswith("/completions") for p, _ in StreamingStubVLLM.calls), timeout=5)
    time.sleep(0.2)  # about 10 tokens on step 1
    stream.load_weights(adapter_update(tmp_path / "b", 2))
    [group] = drain(stream).values()
    stream.close()
    first, continuation = [body for path, body in StreamingStubVLLM.calls if path.endswith("/completions")]
    done = len(continuation["prompt"][0]) - 2
    assert first["model"] == "step_1" and first["n"] == 2 and "seed" in first
    assert continuation["model"] == "step_2" and continuation["n"] == 1 and "seed" not in continuation
    assert "priority" not in continuation  # vLLM refuses it without --scheduling-policy priority
    assert continuation["prompt"] == [[1, 2] + [100 + t for t in range(done)]] * 2
    assert continuation["max_tokens"] == 40 - done and continuation["min_tokens"] == max(0, 30 - done)
    assert StreamingStubVLLM.hung_up == ["step_1"] and 3 <= done < 38
    for c in group:
        assert c.token_ids == [100 + t for t in range(done)] + [100 + t for t in range(40 - done)]
        assert c.token_steps == [1] * done + [2] * (40 - done) and c.is_truncated
    routes = [(p.removeprefix("/v1/"), b.get("lora_name") or b.get("model")) for p, b in StreamingStubVLLM.calls]
    assert routes.count(("unload_lora_adapter", "step_1")) == 1  # after its aborted request ended
