"""Requests nobody waits for leave the engine: a client that hangs up while the engine decodes its
request (plain or streamed) stops it within a decode step, and the next request is served at once; a
server that stops cancels the request it gave up on. On a real loopback socket, with each forward of
the tiny model slowed down so that an uncancelled request would run for many seconds."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request

import pytest

from grpokit.inference.builtin import BuiltinEngine
from grpokit.inference.server.http import make_app, make_server
from tests.support import in_background, serving, slow_forwards, wait_until

PROMPT_IDS = [1, 520, 9531, 198]
LONG = {"prompt": PROMPT_IDS, "n": 2, "max_tokens": 400, "temperature": 1.0}  # 400 x 50 ms: 20 s uncancelled


def post(server, path: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        server.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def slow_server(tiny_model):
    with serving(tiny_model) as (engine, server):
        with slow_forwards(engine) as calls:
            yield server, calls


def send(server, body: dict) -> socket.socket:
    data = json.dumps(body).encode()
    s = socket.create_connection(server.server_address, timeout=10)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
    return s


def running(server) -> bool:
    return server.app.worker.status()["running_s"] is not None


def assert_stops_and_serves_the_next(server, calls, hung_up: float) -> None:
    wait_until(lambda: not running(server), timeout=5)
    stopped = time.monotonic() - hung_up
    assert stopped < 1.0, f"the engine ran on for {stopped:.2f}s after the client left"
    assert len(calls) < 200  # far from the 400 decode steps of the whole request
    start = time.monotonic()
    status, _ = post(server, "/completions", {"prompt": PROMPT_IDS, "max_tokens": 2})
    assert status == 200 and time.monotonic() - start < 2.0


def test_a_client_that_hangs_up_stops_its_running_request_within_a_decode_step(slow_server):
    server, calls = slow_server
    client = send(server, LONG)
    wait_until(lambda: running(server) and len(calls) > 3)
    client.close()
    assert_stops_and_serves_the_next(server, calls, time.monotonic())


def test_a_streaming_client_that_hangs_up_stops_its_request(slow_server):
    server, calls = slow_server
    client = send(server, {**LONG, "stream": True})
    received = b""
    while received.count(b"data: ") < 3:  # the stream has begun: tokens are arriving
        received += client.recv(65536)
    assert received.startswith(b"HTTP/1.1 200") and b"text/event-stream" in received
    client.close()
    assert_stops_and_serves_the_next(server, calls, time.monotonic())


def test_a_stopping_server_cancels_the_request_it_gave_up_on(tiny_model):
    with serving(tiny_model) as (engine, server):
        with slow_forwards(engine) as calls:
            thread, result = in_background(post, server, "/completions", LONG)
            wait_until(lambda: running(server) and len(calls) > 3)
            start = time.monotonic()
            server.app.close(timeout=0.2)
            wait_until(lambda: not server.app.worker.thread.is_alive(), timeout=5)  # the request was cancelled
            assert time.monotonic() - start < 1.5 and len(calls) < 200
            thread.join(10)
    assert result[0][0] == 503 and "stopped before this request finished" in result[0][1]["error"]["message"]


def test_the_fast_path_refuses_top_logprobs_with_a_400_naming_the_field(tiny_model):
    engine = BuiltinEngine(device="cpu", fast="on")
    engine.setup(tiny_model)
    server = make_server(make_app(engine, engine.tokenizer, model_name="tiny"), port=0).start()
    try:
        status, payload = post(server, "/completions", {"prompt": PROMPT_IDS, "logprobs": 2})
        assert status == 400 and payload["error"]["param"] == "logprobs"
        assert (
            "BuiltinEngine on its fast CUDA path) reports only the sampled token's logprob"
            in (payload["error"]["message"])
        )
        status, _ = post(server, "/completions", {"prompt": PROMPT_IDS, "max_tokens": 3, "logprobs": 0})
        assert status == 200
    finally:
        server.close()
