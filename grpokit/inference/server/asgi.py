"""The HTTP layer of `grpokit infer`'s server: Starlette on uvicorn (httptools), the stack vLLM's server uses.

One event loop serves every connection; request bodies are parsed and checked (the app's `dispatch`) on
the loop when small and on Starlette's thread pool when large, answers are serialised the same way, and
engine work is queued for the one engine thread (grpokit.inference.server.worker). The app is any
ServedApp: grpokit.inference.server.http builds OpenAIApp on this module, which never imports it back.
What it adds to a plain uvicorn, each bounded by a `server.limits` key (ServerLimits):
- a deadline for a request's line and headers (TimedProtocol) and for its body (`read_timeout`): a
  slow or half-sent request is answered 408 and disconnected, instead of holding a connection for ever;
- the body size from Content-Length before reading (`max_body_bytes`, 413), and while reading a
  chunked body; a malformed or negative Content-Length is the parser's 400;
- open connections (`max_connections`: a request on one more is answered 503 with Retry-After, by
  TimedProtocol instead of uvicorn's limit_concurrency) and the listen backlog (`backlog`);
- a client that hangs up: its request leaves the queue, or the engine stops it between two decode
  steps (EngineCall.cancelled), streamed or not;
- `stream: true`: the events the engine thread emits, written as they come (StreamingResponse);
- SIGTERM or SIGINT (uvicorn's handlers, in the main thread): the listener closes, queued requests are
  answered 503 with Retry-After, the running one gets `shutdown_timeout` seconds, then the process goes
  on (the engine thread is a daemon).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import socket
import threading
import time
from concurrent.futures import Future
from functools import partial
from typing import Any, Protocol

import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from grpokit.inference.server.browsers import BrowserGuard
from grpokit.inference.server.errors import RequestError
from grpokit.inference.server.limits import ServerLimits
from grpokit.inference.server.stream import DONE, sse
from grpokit.inference.server.worker import EngineCall, EngineWorker, OnEngine

log = logging.getLogger(__name__)
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]
REQUEST_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class ServedApp(Protocol):
    """What the HTTP layer serves (grpokit.inference.server.http's OpenAIApp): `dispatch` answers a request
    or returns the OnEngine work that makes its answer; `worker` runs that work; `close` stops it."""

    limits: ServerLimits
    worker: EngineWorker

    def dispatch(self, method: str, path: str, query: str, body: bytes) -> dict | OnEngine: ...

    def close(self, timeout: float | None = None) -> bool: ...


class ClientGone(Exception):
    """The client closed its connection before its answer was ready."""


def timed_protocol(read_timeout: float, max_connections: int) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with a deadline of `read_timeout` seconds for each request's line and
    headers, from the connection's start or the previous answer (uvicorn itself has none), and at most
    `max_connections` open connections served: a request on a connection beyond them (or while as many
    requests run) is answered 503 with Retry-After: 1, naming the key, and the connection closed. This
    replaces uvicorn's limit_concurrency, whose 503 is plain text without Retry-After and which counts the
    requesting connection among the open ones (limit_concurrency=2 serves one connection at a time).

    httptools (C) rather than h11 (pure Python): h11 parsing and its event objects cost ~0.3 ms per
    request, which made a 1-client request slower than the stdlib server's (docs/benchmarks.md)."""

    class TimedProtocol(HttpToolsProtocol):
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self.app = partial(admit, self.app, self, max_connections)  # one protocol per connection
            self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()  # the request's line and headers arrived in time
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.pipeline and not self.transport.is_closing():  # no next request's headers yet
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(read_timeout, self._expire)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                self.transport.write(REQUEST_TIMEOUT)
                self.transport.close()

    return TimedProtocol


async def admit(app, protocol: HttpToolsProtocol, max_connections: int, scope, receive, send) -> None:
    """Run the ASGI `app` for a request on `protocol`'s connection, or answer 503 with Retry-After when
    more than `max_connections` connections are open (this one included) or requests run (this one's
    task included)."""
    if len(protocol.connections) > max_connections or len(protocol.tasks) > max_connections:
        log.warning(
            "%d connections open: a request answered 503 (server.limits.max_connections)", len(protocol.connections)
        )
        busy = RequestError(
            f"{len(protocol.connections)} connections are open, over server.limits.max_connections="
            f"{max_connections}; retry later",
            status=503,
            retry_after=1,
        )
        await json_response(503, busy.body(), {**busy.headers(), "Connection": "close"})(scope, receive, send)
        return
    await app(scope, receive, send)


def json_response(status: int, payload: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(payload).encode(), status, headers, media_type="application/json")


def internal_error(e: Exception) -> dict:
    message = f"internal error: {type(e).__name__}: {e}"
    return {"error": {"message": message, "type": "InternalServerError", "param": None, "code": 500}}


async def read_body(request: Request, limits: ServerLimits) -> bytes:
    """The body, at most `max_body_bytes` (checked from Content-Length first) within `read_timeout` s."""
    too_large = RequestError(
        f"request body over {limits.max_body_bytes} bytes (server.limits.max_body_bytes)", status=413
    )
    declared = request.headers.get("content-length")
    if declared is not None and int(declared) > limits.max_body_bytes:  # the parser has checked it is a number
        raise too_large

    async def collect() -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limits.max_body_bytes:
                raise too_large
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        return await asyncio.wait_for(collect(), limits.read_timeout)
    except asyncio.TimeoutError:
        raise RequestError(
            f"the request body did not arrive within {limits.read_timeout:g}s (server.limits.read_timeout)",
            status=408,
        ) from None


async def disconnected(request: Request) -> None:
    """Returns when the client closes the connection (its body has been read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _retrieve(future: asyncio.Future) -> None:
    """Mark an answer's exception retrieved, even if nobody waits for it any more."""
    if not future.cancelled():
        future.exception()


def abandon(worker: EngineWorker, future: Future, call: EngineCall, why: str) -> None:
    """Nobody waits for this request any more: take it out of the queue, or have the engine stop it."""
    if worker.withdraw(future):
        log.info("%s before the engine started its request", why)
    elif not future.done():
        call.cancelled.set()
        log.info("%s while the engine ran its request: cancelled", why)


async def on_engine(worker: EngineWorker, request: Request, work, priority: int = 0) -> Any:
    """Queue `work` for the engine thread and wait for its answer; a client that hangs up meanwhile takes
    its request out of the queue, or cancels it on the engine, and raises ClientGone."""
    call = EngineCall()
    future: Future = worker.submit(partial(work, call), call.cancelled, priority)
    answer = asyncio.wrap_future(future)
    answer.add_done_callback(_retrieve)
    gone = asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the server stops waiting (shutdown timeout)
        abandon(worker, future, call, "the server stopped waiting")
        raise
    finally:
        gone.cancel()
    if answer.done():
        return answer.result()
    abandon(worker, future, call, "client left")
    raise ClientGone


async def streamed(worker: EngineWorker, request: Request, work, priority: int = 0) -> Response:
    """Queue streaming `work` and answer with the events it emits, as they come. Until the first event
    (the checks on the engine thread have passed) a refusal is still a JSON error; after it, an error
    is an `error` event. A client that hangs up, before or during the stream, cancels the request."""
    loop, events = asyncio.get_running_loop(), asyncio.Queue()
    call = EngineCall(emit=lambda data: loop.call_soon_threadsafe(events.put_nowait, data))
    future: Future = worker.submit(partial(work, call), call.cancelled, priority)
    answer = asyncio.wrap_future(future)
    answer.add_done_callback(_retrieve)
    first, gone = asyncio.ensure_future(events.get()), asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait({answer, first, gone}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        first.cancel()
        abandon(worker, future, call, "the server stopped waiting")
        raise
    finally:
        gone.cancel()
    if first.done():
        head = first.result()
    else:
        first.cancel()  # an event it may have been woken for stays in the queue
        if not answer.done():
            abandon(worker, future, call, "client left")
            raise ClientGone
        answer.result()  # a refusal: answered as JSON
        head = b""

    def closed() -> None:
        if not answer.done():
            abandon(worker, future, call, "client left during its stream")

    return EngineStream(engine_events(head, events, answer, request), closed)


async def engine_events(head: bytes, events: asyncio.Queue, answer: asyncio.Future, request: Request):
    """`head`, then the engine's events as they come, then what is left once its work is done, an error
    event if it failed, and `[DONE]`; consecutive events that wait are written together."""
    pending = None
    try:
        if head:
            yield head
        while True:
            pending = asyncio.ensure_future(events.get())
            await asyncio.wait({pending, answer}, return_when=asyncio.FIRST_COMPLETED)
            if not pending.done():
                pending.cancel()  # the event it may have been woken for stays in the queue
                break
            data = pending.result()
            while not events.empty():
                data += events.get_nowait()
            yield data
        rest = b"".join(events.get_nowait() for _ in range(events.qsize()))
        if answer.exception() is not None:
            rest += sse(error_body(answer.exception(), request))
        yield rest + DONE
    finally:
        if pending is not None:
            pending.cancel()


class EngineStream(StreamingResponse):
    """Server-sent events from the engine thread; `closed()` runs once the response ends, however it
    ends (a client that hung up: Starlette cancels the stream)."""

    def __init__(self, content, closed) -> None:
        super().__init__(content, media_type="text/event-stream")
        self.closed = closed

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.closed()


# A small request is parsed, and a small answer serialised, on the event loop (well under a millisecond);
# larger ones on Starlette's thread pool, so that a long body or answer does not hold up other
# connections. Each hand-off to the pool cost ~0.2 ms a request, most of a 1-client request's overhead.
INLINE_BODY_BYTES = 64 * 1024
INLINE_ANSWER_TOKENS = 512


def is_small(answer: Any) -> bool:
    """Whether an answer holds at most INLINE_ANSWER_TOKENS completion tokens (its OpenAI `usage`)."""
    usage = answer.get("usage") if isinstance(answer, dict) else None
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return isinstance(tokens, int) and tokens <= INLINE_ANSWER_TOKENS


def error_body(e: BaseException, request: Request) -> dict:
    if isinstance(e, RequestError):
        return e.body()
    log.error("request to %s failed", request.url.path, exc_info=e)
    return internal_error(e)


def asgi_app(app: ServedApp, guard: BrowserGuard) -> Starlette:
    """Every path goes to `app.dispatch` (which answers 404 and 405 in the API's JSON error format), once
    `guard` has let the request's Host and Origin through (grpokit.inference.server.browsers)."""

    async def endpoint(request: Request) -> Response:
        try:
            guard.check(request.headers)
            body = await read_body(request, app.limits) if request.method == "POST" else b""
            route = (request.method, request.url.path, request.url.query, body)
            answer = (
                app.dispatch(*route)
                if len(body) <= INLINE_BODY_BYTES
                else await run_in_threadpool(app.dispatch, *route)
            )
            if isinstance(answer, OnEngine):
                if answer.stream:
                    return await streamed(app.worker, request, answer.work, answer.priority)
                answer = await on_engine(app.worker, request, answer.work, answer.priority)
                if is_small(answer):
                    return json_response(200, answer)
                return await run_in_threadpool(json_response, 200, answer)
            return json_response(200, answer)
        except RequestError as e:
            return json_response(e.status, e.body(), e.headers())
        except (ClientGone, ClientDisconnect):
            return Response(status_code=499)  # nobody reads it: uvicorn drops answers to closed connections
        except Exception as e:  # the client gets the error's text, the server log gets the traceback
            log.exception("request to %s failed", request.url.path)
            return json_response(500, internal_error(e))

    return Starlette(routes=[Route("/{path:path}", endpoint, methods=METHODS)])


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, whose shutdown first closes the listener, then stops the engine thread (queued
    requests answered 503, the running one given shutdown_timeout), then lets uvicorn finish."""

    def __init__(self, config: uvicorn.Config, app: ServedApp) -> None:
        super().__init__(config)
        self.grpokit_app = app

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in getattr(self, "servers", []):
            server.close()
        await asyncio.get_running_loop().run_in_executor(None, self.grpokit_app.close)
        await super().shutdown(sockets=sockets)


def listen(host: str, port: int, backlog: int) -> socket.socket:
    """A TCP socket listening on exactly `host`:`port`."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=backlog)
    except OSError as e:
        raise OSError(f"the server cannot listen on {host}:{port} (server.host, server.port): {e}") from e


class OpenAIServer:
    """The HTTP server of an app (OpenAIApp), bound at construction: `serve_forever()` in the main thread (stops
    on SIGTERM or SIGINT), or `start()` in a background thread and `close()`."""

    def __init__(
        self,
        app: ServedApp,
        host: str = "127.0.0.1",
        port: int = 8000,
        allowed_hosts: list[str] | None = None,
        allowed_origins: list[str] | tuple[str, ...] = (),
    ) -> None:
        self.app = app
        self.socket = listen(host, port, app.limits.backlog)
        self.server_address = self.socket.getsockname()[:2]
        config = uvicorn.Config(
            asgi_app(app, BrowserGuard.for_address(host, allowed_hosts, list(allowed_origins))),
            http=timed_protocol(app.limits.read_timeout, app.limits.max_connections),
            ws="none",
            lifespan="off",
            loop="asyncio",
            log_config=None,
            access_log=False,
            server_header=False,
            proxy_headers=False,  # no proxy in front: the client address is the socket's
            backlog=app.limits.backlog,
            limit_concurrency=None,  # max_connections is TimedProtocol's
            timeout_graceful_shutdown=app.limits.shutdown_timeout,
        )
        self.uvicorn = _Uvicorn(config, app)
        self.thread: threading.Thread | None = None
        if not ipaddress.ip_address(self.server_address[0]).is_loopback:
            log.warning("serving on %s: reachable from other machines, with no authentication", self.server_address[0])

    @property
    def url(self) -> str:
        """Base URL for OpenAI clients, e.g. http://127.0.0.1:8000/v1."""
        host, port = self.server_address
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/v1"

    def serve_forever(self) -> None:
        self.uvicorn.run(sockets=[self.socket])

    def start(self, timeout: float = 30.0) -> OpenAIServer:
        """Serve in a background thread; returns once the server accepts connections."""
        self.thread = threading.Thread(target=self.serve_forever, name="grpokit-server", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.uvicorn.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server at {self.url} did not start")
            time.sleep(0.01)
        return self

    def close(self) -> None:
        """Stop serving, join the server thread (if started) and the engine thread (see OpenAIApp.close)."""
        if self.thread is not None:
            self.uvicorn.should_exit = True
            self.thread.join()
        self.socket.close()
        self.app.close()

    def __enter__(self) -> OpenAIServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
