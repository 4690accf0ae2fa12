"""Servers for client tests: a scripted misbehaving peer, a stub peer answering by request, and the builtin
engine behind grpokit's server."""

from __future__ import annotations

import contextlib
import json
import time


class ScriptedServer:
    """An HTTP server on a real loopback socket that answers each POST with the next step of a script, for
    testing clients against a peer that misbehaves. Steps: a dict or list (a 200 answer with that JSON
    body), bytes (a 200 answer with that raw body), a tuple (status, headers, JSON body) for any other
    answer (a 429 with Retry-After, a redirect), "close" (the connection is dropped once the request is
    read), "half" (a 200 whose body stops halfway, then the connection drops), "hang" (no answer until
    stop()). The last step repeats. `request_times` holds the monotonic arrival time of every POST,
    `request_headers` its headers, `request_bodies` its JSON body (None when empty or not JSON).

        with ScriptedServer(["close", {"choices": []}]) as server:
            RemoteEngine(base_url=server.url)
    """

    def __init__(self, script: list) -> None:
        import http.server
        import threading

        self.script, self.request_times, self.request_headers, self.released = list(script), [], [], threading.Event()
        self.request_bodies: list = []
        scripted = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    scripted.request_bodies.append(json.loads(raw) if raw else None)
                except ValueError:
                    scripted.request_bodies.append(None)
                step = scripted.script[min(len(scripted.request_times), len(scripted.script) - 1)]
                scripted.request_times.append(time.monotonic())
                scripted.request_headers.append(dict(self.headers))
                if step == "hang":
                    scripted.released.wait()
                if isinstance(step, str):
                    self.close_connection = True
                    if step == "half":
                        self.send_response(200)
                        self.send_header("Content-Length", "1000")
                        self.end_headers()
                        self.wfile.write(b'{"choices": [')
                    return
                status, headers = (step[0], step[1]) if isinstance(step, tuple) else (200, {})
                step = step[2] if isinstance(step, tuple) else step
                body = step if isinstance(step, bytes) else json.dumps(step).encode()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def stop(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> ScriptedServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class JsonStub:
    """A stub peer's POST handler: a subclass's `answer(path, body)` (body: the request's JSON) returns
    (status, payload bytes); nothing is logged. `stub_server` serves it."""

    def answer(self, path: str, body: dict) -> tuple[int, bytes]:
        raise NotImplementedError


@contextlib.contextmanager
def stub_server(stub: type[JsonStub]):
    """`stub` (a JsonStub subclass) on a free loopback port; yields the base URL (`http://127.0.0.1:P/v1`)."""
    import http.server
    import threading

    class Handler(stub, http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            code, payload = self.answer(self.path, json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(code)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1"
    finally:
        server.shutdown()


@contextlib.contextmanager
def serving(model: str, broadcast=None, model_name: str = "tiny"):
    """The builtin engine (CPU) on `model` behind grpokit's OpenAI-compatible server on a free loopback
    port, following `broadcast` if given; yields (engine, server) and closes the server after."""
    from grpokit.inference.builtin import BuiltinEngine
    from grpokit.inference.server.http import make_app, make_server

    engine = BuiltinEngine(device="cpu")
    engine.setup(model)
    server = make_server(make_app(engine, engine.tokenizer, model_name=model_name, broadcast=broadcast), port=0).start()
    try:
        yield engine, server
    finally:
        server.close()


@contextlib.contextmanager
def slow_forwards(engine, seconds: float = 0.05):
    """Each forward of the engine's model takes `seconds` longer (so that a test can act while a request
    decodes); yields the list of the forwards' start times."""
    forward, calls = engine.model.forward, []

    def slow(*args, **kwargs):
        calls.append(time.monotonic())
        time.sleep(seconds)
        return forward(*args, **kwargs)

    engine.model.forward = slow
    try:
        yield calls
    finally:
        del engine.model.forward
