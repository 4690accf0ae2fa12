"""The server under abuse and load, on a real loopback socket: every limit of `server.limits` is checked
before any work and answered with a 4xx naming its key within a second or two (the server's peak memory,
measured per case, grows less than 200 MB); malformed HTTP is a 400, slow clients a 408, a full queue a
429 with Retry-After, a connection over max_connections a 503 with Retry-After; a client that hangs up
leaves the queue; 40 simultaneous connections are all answered; request-supplied chat templates are
refused unless the server trusts them."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from grpokit.inference.builtin import BuiltinEngine
from grpokit.inference.server.http import make_app, make_server
from grpokit.inference.server.limits import ServerLimits
from tests.support import in_background, wait_until

MESSAGES = [{"role": "user", "content": "Reverse the text: hello"}]
PROMPT_IDS = [1, 520, 9531, 198]
LOOPS = "{% for i in range(99999) %}{% for j in range(99999) %}x{% endfor %}{% endfor %}"  # ~10^10 steps
SMALL = {"max_n": 8, "max_rows": 16, "max_body_bytes": 2**20, "max_queued_requests": 2, "read_timeout": 1.0}


@contextlib.contextmanager
def limited_server(model: str, **limits):
    """The builtin engine behind the server with these server.limits, on a free loopback port."""
    engine = BuiltinEngine(device="cpu")
    engine.setup(model)
    app = make_app(engine, engine.tokenizer, model_name="tiny", limits=ServerLimits(**limits))
    server = make_server(app, port=0).start()
    try:
        yield engine, server
    finally:
        server.close()


@pytest.fixture(scope="module")
def small(tiny_model):
    with limited_server(tiny_model, **SMALL) as (_, server):
        yield server


def post(server, path: str, body, timeout: float = 60) -> tuple[int, dict, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(server.url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, json.loads(r.read()), r.headers
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), e.headers


def raw(server, data: bytes, timeout: float = 10) -> bytes:
    """Send raw bytes and read until the server closes the connection."""
    with socket.create_connection(server.server_address, timeout=timeout) as s:
        s.sendall(data)
        response = b""
        while chunk := s.recv(65536):
            response += chunk
    return response


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


PROC = Path("/proc/self")  # the servers of these tests run in this process (uvicorn in a thread)
MAX_GROWTH_MB = 200  # the stdlib server took n = 2^70 to 9.85 GB; a 16 MB prompt to 12.7 GB (docs/reliability.md)


def vm_mb(key: str) -> float:
    """A memory figure (VmRSS, VmHWM) of the server's process, in MB."""
    for line in (PROC / "status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(key)


@contextlib.contextmanager
def peak_memory_grows_less_than(mb: float = MAX_GROWTH_MB):
    """Fail if the server's process peaks more than `mb` MB of resident memory above what it held when the
    block began. Linux: the kernel's peak (VmHWM) is reset to the current RSS (clear_refs 5) and read after
    the block; where clear_refs cannot be written, a thread samples VmRSS every 2 ms. Not measured where
    there is no /proc."""
    if not (PROC / "status").exists():
        yield
        return
    start = vm_mb("VmRSS")
    try:
        (PROC / "clear_refs").write_text("5")
    except OSError:
        peak, stop = [start], threading.Event()

        def sample() -> None:
            while not stop.wait(0.002):
                peak[0] = max(peak[0], vm_mb("VmRSS"))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            yield
        finally:
            stop.set()
            sampler.join(10)
        growth = max(peak[0], vm_mb("VmRSS")) - start
    else:
        yield
        growth = vm_mb("VmHWM") - start
    assert growth < mb, f"the server's peak resident memory grew {growth:.0f} MB (limit {mb} MB)"


ABUSE = [
    ("/completions", {"prompt": PROMPT_IDS, "n": 2**70, "max_tokens": 1}, "n", "server.limits.max_n"),
    (
        "/completions",
        {"prompt": [PROMPT_IDS] * 3, "n": 8},
        "prompt",
        "24 completions in one request, over server.limits.max_rows=16",
    ),
    ("/chat/completions", {"messages": MESSAGES, "n": 10_000, "max_tokens": 4}, "n", "<= 8 (server.limits.max_n)"),
    ("/completions", {"prompt": "a" * 900_000}, "prompt", "the prompt has 900000 characters: more than 511 tokens"),
    ("/completions", {"prompt": list(range(1, 601))}, "prompt", "the prompt has 600 tokens, over the limit of 511"),
    (
        "/completions",
        {"prompt": "hello " * 600, "max_tokens": 4},
        "prompt",
        "tokens, over the limit of 511 (this model's context of 512",
    ),
    (
        "/chat/completions",
        {"messages": [{"role": "user", "content": "hello " * 600}]},
        "messages",
        "tokens, over the limit of 511",
    ),
    (
        "/chat/completions",
        {"messages": [{"role": "user", "content": "x"}] * 600},
        "messages",
        "the prompt has 600 tokens",
    ),
    (
        "/completions",
        {"prompt": PROMPT_IDS, "max_tokens": 512},
        "max_tokens",
        "context is 512 tokens: max_tokens=512 leaves no room",
    ),
    (
        "/completions",
        {"prompt": PROMPT_IDS, "max_tokens": 510},
        "max_tokens",
        "4 prompt tokens leave room for 508, not max_tokens=510",
    ),
    (
        "/completions",
        b'{"prompt": "x", "temperature": Infinity}',
        "temperature",
        "must be a finite number, got Infinity",
    ),
    ("/completions", b'{"prompt": "x", "temperature": -Infinity}', "temperature", "finite"),
    ("/completions", b'{"prompt": "x", "top_p": NaN}', "top_p", "finite"),
    ("/completions", b'{"prompt": "x", "repetition_penalty": 1e999}', "repetition_penalty", "finite"),
    ("/completions", b"[" * 100_000, None, "nests JSON arrays or objects too deeply"),
    ("/chat/completions", b'{"messages": ' + b'{"a": ' * 100_000, None, "too deeply"),
    (
        "/chat/completions",
        {"messages": MESSAGES, "chat_template_kwargs": {"chat_template": LOOPS}},
        "chat_template_kwargs",
        "--server.limits.trust_request_chat_template true",
    ),
    (
        "/chat/completions",
        {"messages": MESSAGES, "chat_template": None, "chat_template_kwargs": {"chat_template": LOOPS}},
        "chat_template_kwargs",
        "renders only its own chat template",
    ),
    (
        "/chat/completions",
        {"messages": MESSAGES, "chat_template": "{{ 'x' }}"},
        "chat_template",
        "renders only its own chat template",
    ),
    (
        "/chat/completions",
        {"messages": MESSAGES, "chat_template_kwargs": {"tokenize": False}},
        "chat_template_kwargs",
        "chat_template_kwargs.tokenize is set by the server",
    ),
    ("/completions", {"prompt": "x", "stop": ["a"] * 100_000}, "stop", "100000 stop strings, over the limit of 16"),
    ("/chat/completions", {"messages": MESSAGES, "stop": "x" * 300}, "stop", "300 characters, over the limit of 256"),
    ("/completions", {"prompt": "x", "logprobs": 10**6}, "logprobs", "(server.limits.max_top_logprobs)"),
    (
        "/chat/completions",
        {"messages": MESSAGES, "logprobs": True, "top_logprobs": 10**6},
        "top_logprobs",
        "in [0, 20] (server.limits.max_top_logprobs)",
    ),
]


@pytest.mark.parametrize(("path", "body", "param", "message"), ABUSE, ids=range(len(ABUSE)))
def test_each_abuse_gets_a_400_naming_the_limit_within_a_second(small, path, body, param, message):
    refused_at_once(small, path, body, param, message)


def refused_at_once(server, path: str, body: dict, param: str, message: str) -> str:
    """POST `body`: a 400 naming `param` whose message holds `message`, within 2 s and without the server's
    peak memory growing past MAX_GROWTH_MB; returns the message."""
    with peak_memory_grows_less_than():
        start = time.monotonic()
        status, payload, _ = post(server, path, body)
        elapsed = time.monotonic() - start
    assert status == 400 and payload["error"]["param"] == param, payload
    assert message in payload["error"]["message"], payload["error"]["message"]
    assert elapsed < 2.0, f"{elapsed:.2f}s"
    return payload["error"]["message"]


HELLO_60 = "hello" + " hello" * 59  # 60 tokens
CAPPED = [  # a server started with server.limits.max_prompt_tokens=50
    ("/completions", {"prompt": list(range(1, 61))}, "prompt", "the prompt has 60 tokens, over the limit of 50"),
    ("/completions", {"prompt": HELLO_60}, "prompt", "the prompt has 60 tokens, over the limit of 50"),
    ("/completions", {"prompt": "a" * 4051}, "prompt", "4051 characters: more than 50 tokens"),  # 50 x 81: unread
    ("/chat/completions", {"messages": [{"role": "user", "content": HELLO_60}]}, "messages", "over the limit of 50"),
    ("/chat/completions", {"messages": [{"role": "user", "content": "x"}] * 60}, "messages", "60 tokens"),
]


@pytest.fixture(scope="module")
def capped(tiny_model):
    with limited_server(tiny_model, max_prompt_tokens=50) as (_, server):
        yield server


@pytest.mark.parametrize(("path", "body", "param", "message"), CAPPED, ids=range(len(CAPPED)))
def test_an_explicit_max_prompt_tokens_is_named_in_its_400(capped, path, body, param, message):
    """A short text is tokenised first, then counted; one longer than the limit x the longest vocabulary
    entry (81 characters) is refused unread, as are more messages than the limit."""
    error = refused_at_once(capped, path, body, param, message)
    assert "(server.limits.max_prompt_tokens)" in error, error


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"Content-Length: -1\r\n", 400),
        (b"Content-Length: 12abc\r\n", 400),
        (b"Content-Length: 50000000\r\n", 413),  # 50 MB announced, none sent: refused before reading
        (b"Transfer-Encoding: chunked\r\n\r\n200000\r\n" + b"x" * 2**20 + b"\r\n", 413),  # over 1 MiB while reading
    ],
    ids=["negative Content-Length", "garbage Content-Length", "body over max_body_bytes", "chunked body over it"],
)
def test_malformed_or_oversized_requests_are_refused_without_a_500(small, head, status):
    with peak_memory_grows_less_than():
        start = time.monotonic()
        request = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        response = raw(small, request + head + b"\r\n")
        elapsed = time.monotonic() - start
    assert status_of(response) == status and b"Traceback" not in response
    if status == 413:
        assert b"server.limits.max_body_bytes" in response
    assert elapsed < 2.0, f"{elapsed:.2f}s"


@pytest.mark.parametrize(
    "partial",
    [
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n",
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{",
    ],
    ids=["half-sent headers", "half-sent body"],
)
def test_a_half_sent_request_is_answered_408_after_read_timeout(small, partial):
    with peak_memory_grows_less_than():
        start = time.monotonic()
        response = raw(small, partial)
        elapsed = time.monotonic() - start
    assert status_of(response) == 408 and 0.9 < elapsed < 3.0, f"{elapsed:.2f}s"


def test_models_by_id(small):
    with urllib.request.urlopen(small.url + "/models/tiny", timeout=30) as r:
        card = json.loads(r.read())
    assert card["id"] == "tiny" and card["object"] == "model" and card["max_model_len"] == 512
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(small.url + "/models/gpt-4o", timeout=30)
    assert e.value.code == 404 and "`gpt-4o` does not exist" in json.loads(e.value.read())["error"]["message"]


@contextlib.contextmanager
def blocked_engine(engine):
    """The engine's generate waits on the returned event; `calls` counts the requests that reached it."""
    release, calls, generate = threading.Event(), [], engine.generate

    def held(*args, **kwargs):
        calls.append(args)
        release.wait(60)
        return generate(*args, **kwargs)

    engine.generate = held
    try:
        yield release, calls
    finally:
        release.set()
        engine.generate = generate


def test_a_full_queue_is_answered_429_with_retry_after(tiny_model):
    body = {"prompt": PROMPT_IDS, "max_tokens": 2}
    with limited_server(tiny_model, max_queued_requests=2) as (engine, server):
        with blocked_engine(engine) as (release, calls):
            running = in_background(post, server, "/completions", body)
            wait_until(lambda: len(calls) == 1)
            queued = [in_background(post, server, "/completions", body) for _ in range(2)]
            wait_until(lambda: server.app.worker.status()["queued"] == 2)
            with peak_memory_grows_less_than():
                status, payload, headers = post(server, "/completions", body)
            assert status == 429 and "server.limits.max_queued_requests=2" in payload["error"]["message"]
            assert 1 <= int(headers["Retry-After"]) <= 60
            release.set()
            for thread, result in [running, *queued]:
                thread.join(60)
                assert result[0][0] == 200


def test_a_client_that_hangs_up_leaves_the_queue_before_the_engine_runs_it(tiny_model):
    with limited_server(tiny_model) as (engine, server):
        with blocked_engine(engine) as (release, calls):
            running = in_background(post, server, "/completions", {"prompt": PROMPT_IDS, "max_tokens": 2})
            wait_until(lambda: len(calls) == 1)
            body = json.dumps({"prompt": PROMPT_IDS, "n": 64, "max_tokens": 400}).encode()
            with socket.create_connection(server.server_address, timeout=10) as s:
                head = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n" % len(body)
                s.sendall(head + body)
                wait_until(lambda: server.app.worker.status()["queued"] == 1)
            wait_until(lambda: server.app.worker.status()["queued"] == 0)  # gone with its client
            release.set()
            running[0].join(60)
            assert running[1][0][0] == 200
            time.sleep(0.3)
            assert len(calls) == 1 and server.app.worker.status() == {"queued": 0, "running_s": None, "alive": True}


def test_forty_simultaneous_connections_are_all_answered(tiny_model):
    with limited_server(tiny_model) as (_, server):
        barrier, results = threading.Barrier(40), []

        def client(i: int) -> None:
            barrier.wait()
            results.append(post(server, "/completions", {"prompt": PROMPT_IDS, "max_tokens": 1, "seed": i})[0])

        threads = [threading.Thread(target=client, args=(i,)) for i in range(40)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert results == [200] * 40


def test_a_trusted_request_template_renders_and_an_empty_render_is_a_400(tiny_model):
    template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    with limited_server(tiny_model, trust_request_chat_template=True) as (engine, server):
        base = {"messages": MESSAGES, "max_tokens": 2, "return_token_ids": True}
        status, payload, _ = post(server, "/chat/completions", {**base, "chat_template": template})
        expected = engine.tokenizer.apply_chat_template(
            MESSAGES, chat_template=template, tokenize=True, return_dict=False
        )
        assert status == 200 and payload["prompt_token_ids"] == list(expected)
        kwargs = {"chat_template": "{% if false %}x{% endif %}"}
        status, payload, _ = post(server, "/chat/completions", {**base, "chat_template_kwargs": kwargs})
        assert status == 400 and payload["error"]["param"] == "messages"
        assert "rendered the messages to no tokens" in payload["error"]["message"]


def test_connections_over_max_connections_get_a_503_with_retry_after(tiny_model):
    """max_connections=2: two idle connections are served, a request on a third is answered 503 with
    Retry-After naming the key (uvicorn's own limit served one connection and gave no Retry-After); once
    one closes, a new connection is answered."""
    request = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    with limited_server(tiny_model, max_connections=2) as (_, server):
        open_now = server.uvicorn.server_state.connections
        idle = [socket.create_connection(server.server_address, timeout=10) for _ in range(2)]
        try:
            wait_until(lambda: len(open_now) == 2)
            start = time.monotonic()
            response = raw(server, request)
            elapsed = time.monotonic() - start
            head, _, body = response.partition(b"\r\n\r\n")
            assert status_of(response) == 503 and elapsed < 2.0, (response, elapsed)
            assert b"\r\nretry-after: 1\r\n" in head.lower() and b"connection: close" in head.lower()
            assert "server.limits.max_connections=2" in json.loads(body)["error"]["message"]
            idle[0].close()
            wait_until(lambda: len(open_now) == 1)
            with urllib.request.urlopen(server.url + "/models", timeout=30) as r:
                assert r.status == 200
            idle[1].sendall(request)  # a held connection is served too
            response = b""
            while chunk := idle[1].recv(65536):
                response += chunk
            assert status_of(response) == 200
        finally:
            for s in idle:
                s.close()
