"""An OpenAI-compatible HTTP server in front of any InferenceEngine, so one client serves the builtin
engine and vLLM alike.

Endpoints: `GET /v1/models`, `POST /v1/completions`, `POST /v1/chat/completions`, `GET /health`, and
grpokit's `GET /v1/weights`. Requests are parsed on the HTTP threads; all tokenizer and engine work runs
on one worker thread that owns both (the engine is not thread-safe, nor are HF fast tokenizers), so
concurrent requests queue. With a `broadcast`, that thread loads any newer published weights before
each request and before answering `/v1/weights`.

Built on the standard library's ThreadingHTTPServer: grpokit declares no web framework (uvicorn and
starlette are only transitive dependencies of verifiers), every grpokit process imports this module
during component discovery, and a synchronous engine gains nothing from asyncio.

Where it departs from the OpenAI API:
- vLLM extensions: `return_token_ids` adds `prompt_token_ids` (top level for chat, per choice for
  completions) and per-choice `token_ids`; `chat_template_kwargs` is passed to the chat template.
- Every response carries a top-level `weight_step`: the trainer step of the weights that produced it.
- `GET /v1/weights` answers `{"weight_step"}`, the step the engine holds once it has loaded the newest
  published one: the trainer's progress for an orchestrator whose broadcast only this process may poll
  (NCCLBroadcast, IPCBroadcast). `?sha256=true` adds the engine's checksum of those weights
  (InferenceEngine.weights_sha256), to compare with the trainer's.
- Only the sampled token's logprob exists (the engine has no top-k): chat `top_logprobs` and
  completions `logprobs` above 0 are refused. Logprobs are of the temperature-scaled distribution.
- `min_tokens` and `repetition_penalty` (vLLM extensions) are honoured, and logprobs are of the
  processed distribution (stop tokens masked, penalty applied, then temperature).
- No streaming, tools, presence/frequency penalties, logit bias, echo or best_of: a non-default value
  is a 400, never silently ignored. Other unknown fields are ignored, as vLLM does.
- Token ids keep a stop string and the EOS token, as the engine sampled them; `text` and `content`
  end before the stop string, as in OpenAI's API.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import CancelledError, ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import accumulate
from typing import Any
from urllib.parse import parse_qsl

from grpokit.broadcast import WeightBroadcast
from grpokit.inference import Completion, InferenceEngine, SamplingSettings
from grpokit.inference.server.requests import RequestError, SamplingRequest, field, parse_messages, parse_prompts

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 64 * 2**20
DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions
MIN_LOGPROB = -9999.0  # JSON has no -inf; vLLM clamps the same way


def finish_reason(c: Completion) -> str:
    return "length" if c.is_truncated else "stop"


class OpenAIApp:
    """The server's logic without the HTTP: `handle(method, path, body) -> (status, json)`."""

    def __init__(
        self,
        engine: InferenceEngine,
        tokenizer,
        model_name: str,
        broadcast: WeightBroadcast | None,
        max_model_len: int | None,
    ) -> None:
        self.engine, self.tokenizer, self.model_name, self.broadcast = engine, tokenizer, model_name, broadcast
        self.max_model_len = max_model_len
        self.vocab_size = len(tokenizer)
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grpokit-engine")

    def handle(self, method: str, path: str, body: bytes) -> tuple[int, dict]:
        routes = {
            "/v1/models": ("GET", self.models),
            "/v1/completions": ("POST", self.completions),
            "/v1/chat/completions": ("POST", self.chat_completions),
            "/health": ("GET", lambda _: {}),
            "/v1/weights": ("GET", self.weights),
        }
        path, _, query = path.partition("?")
        path = path.rstrip("/")
        try:
            if path not in routes:
                raise RequestError(f"no route {path}", status=404)
            if method != routes[path][0]:
                raise RequestError(f"{path} takes {routes[path][0]}, not {method}", status=405)
            return 200, routes[path][1](self.parse_body(body) if method == "POST" else dict(parse_qsl(query)))
        except RequestError as e:
            return e.status, e.body()
        except Exception as e:  # the client gets the error's text, the server log gets the traceback
            log.exception("request to %s failed", path)
            return 500, {
                "error": {
                    "message": f"internal error: {type(e).__name__}: {e}",
                    "type": "InternalServerError",
                    "param": None,
                    "code": 500,
                }
            }

    def parse_body(self, body: bytes) -> dict:
        try:
            parsed = json.loads(body or b"null")
        except (ValueError, UnicodeDecodeError) as e:
            raise RequestError(f"request body is not valid JSON: {e}") from None
        if not isinstance(parsed, dict):
            raise RequestError("request body must be a JSON object")
        model = field(parsed, "model", str, self.model_name)
        if model != self.model_name:
            raise RequestError(
                f"the model `{model}` does not exist; this server serves `{self.model_name}`", "model", 404
            )
        return parsed

    def models(self, _: dict) -> dict:
        card = {
            "id": self.model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "grpokit",
            "root": self.model_name,
        }
        if self.max_model_len is not None:
            card["max_model_len"] = self.max_model_len
        return {"object": "list", "data": [card], "weight_step": self.engine.weight_step}

    def weights(self, query: dict) -> dict:
        """The step of the weights the engine holds, after loading the newest published one; with
        `sha256=true`, the engine's checksum of them too."""
        checksum = query.get("sha256", "false")
        if checksum not in ("true", "false"):
            raise RequestError(f"sha256 must be true or false, got {checksum!r}", "sha256")

        def work() -> dict:
            self.load_newer_weights()
            answer = {"object": "weights", "weight_step": self.engine.weight_step}
            if checksum == "true":
                try:
                    answer["sha256"] = self.engine.weights_sha256()
                except NotImplementedError as e:
                    raise RequestError(str(e), "sha256") from None
            return answer

        return self.on_engine_thread(work)

    def completions(self, body: dict) -> dict:
        prompts = parse_prompts(body)
        logprobs = field(
            body,
            "logprobs",
            int,
            None,
            lambda v: v == 0,
            "0 or null (the engine returns only the sampled token's logprob)",
        )
        max_tokens = field(body, "max_tokens", int, DEFAULT_COMPLETION_TOKENS, lambda v: v >= 1, ">= 1")
        params = SamplingRequest.parse(body, max_tokens, logprobs is not None)

        def work() -> dict:
            ids = [self.encode(p) for p in prompts]
            groups = self.sample(ids, params)
            choices = []
            for prompt, group in zip(ids, groups):
                for c in group:
                    choice = {
                        "index": len(choices),
                        "text": self.text(c, params.stop),
                        "logprobs": None,
                        "finish_reason": finish_reason(c),
                    }
                    if params.logprobs:
                        choice["logprobs"] = self.completion_logprobs(c)
                    if params.return_token_ids:
                        choice.update(prompt_token_ids=prompt, token_ids=c.token_ids)
                    choices.append(choice)
            return self.envelope("cmpl", "text_completion", choices, ids, groups)

        return self.on_engine_thread(work)

    def chat_completions(self, body: dict) -> dict:
        messages = parse_messages(body)
        template_kwargs = field(body, "chat_template_kwargs", dict, {})
        field(body, "top_logprobs", int, 0, lambda v: v == 0, "0 (the engine returns only the sampled token's logprob)")
        max_tokens = field(body, "max_completion_tokens", int, None, lambda v: v >= 1, ">= 1")
        max_tokens = max_tokens or field(body, "max_tokens", int, None, lambda v: v >= 1, ">= 1")
        params = SamplingRequest.parse(body, max_tokens, field(body, "logprobs", bool, False))

        def work() -> dict:
            prompt = self.render(messages, template_kwargs)
            group = self.sample([prompt], params)[0]
            choices = []
            for i, c in enumerate(group):
                message = {"role": "assistant", "content": self.text(c, params.stop)}
                choice = {"index": i, "message": message, "logprobs": None, "finish_reason": finish_reason(c)}
                if params.logprobs:
                    choice["logprobs"] = {"content": self.chat_logprobs(c)}
                if params.return_token_ids:
                    choice["token_ids"] = c.token_ids
                choices.append(choice)
            response = self.envelope("chatcmpl", "chat.completion", choices, [prompt], [group])
            if params.return_token_ids:
                response["prompt_token_ids"] = prompt
            return response

        return self.on_engine_thread(work)

    # --- on the engine thread ---

    def on_engine_thread(self, work: Callable[[], dict]) -> dict:
        try:
            future = self.worker.submit(work)
        except RuntimeError:  # the worker has been shut down
            raise RequestError("the server is shutting down", status=503) from None
        try:
            return future.result()
        except CancelledError:  # queued when the worker was shut down
            raise RequestError("the server is shutting down", status=503) from None

    def encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)  # special tokens added, as vLLM does for completions
        if not all(0 <= t < self.vocab_size for t in prompt):
            raise RequestError(f"prompt token ids must be in [0, {self.vocab_size})", "prompt")
        return prompt

    def render(self, messages: list[dict], template_kwargs: dict) -> list[int]:
        try:
            return list(
                self.tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=True, return_dict=False, **template_kwargs
                )
            )
        except Exception as e:  # jinja raises for messages its template rejects (roles out of order, ...)
            raise RequestError(
                f"the chat template rejected the messages: {type(e).__name__}: {e}", "messages"
            ) from None

    def load_newer_weights(self) -> None:
        """Load the newest weights the broadcast has published, if newer than the engine's."""
        if self.broadcast is not None and (update := self.broadcast.poll(self.engine.weight_step)) is not None:
            log.info("loading weights of step %d (was %d)", update.step, self.engine.weight_step)
            self.engine.load_weights(update)

    def sample(self, prompts: list[list[int]], params: SamplingRequest) -> list[list[Completion]]:
        """Load newer broadcast weights, check the context length, then sample n completions per prompt."""
        self.load_newer_weights()
        room = None if self.max_model_len is None else self.max_model_len - max(map(len, prompts))
        max_tokens = params.max_tokens or max(
            room or SamplingSettings.max_tokens, 1
        )  # chat default: the rest of the context
        if room is not None and max_tokens > room:
            used = self.max_model_len - room
            raise RequestError(
                f"this model's context is {self.max_model_len} tokens: {used} "
                f"prompt tokens leave room for {room}, not max_tokens={max_tokens}",
                "max_tokens",
            )
        if params.min_tokens > max_tokens:
            raise RequestError(f"min_tokens ({params.min_tokens}) exceeds max_tokens ({max_tokens})", "min_tokens")
        sampling = SamplingSettings(
            params.temperature,
            params.top_p,
            max_tokens,
            params.stop,
            params.seed,
            params.min_tokens,
            params.repetition_penalty,
        )
        return self.engine.generate(prompts, params.n, sampling)

    def text(self, c: Completion, stop: list[str]) -> str:
        text = self.tokenizer.decode(c.token_ids, skip_special_tokens=True)
        return text[: min((i for i in (text.find(s) for s in stop) if i >= 0), default=len(text))]

    def chat_logprobs(self, c: Completion) -> list[dict]:
        tokens = [self.tokenizer.decode([t]) for t in c.token_ids]
        return [
            {"token": s, "logprob": max(lp, MIN_LOGPROB), "bytes": list(s.encode()), "top_logprobs": []}
            for s, lp in zip(tokens, c.logprobs)
        ]

    def completion_logprobs(self, c: Completion) -> dict:
        tokens = [self.tokenizer.decode([t]) for t in c.token_ids]
        logprobs = [max(lp, MIN_LOGPROB) for lp in c.logprobs]
        offsets = list(accumulate(map(len, tokens), initial=0))[:-1]
        return {
            "tokens": tokens,
            "token_logprobs": logprobs,
            "top_logprobs": [{s: lp} for s, lp in zip(tokens, logprobs)],
            "text_offset": offsets,
        }

    def envelope(
        self, prefix: str, kind: str, choices: list[dict], prompts: list[list[int]], groups: list[list[Completion]]
    ) -> dict:
        prompt_tokens = sum(map(len, prompts))
        completion_tokens = sum(len(c.token_ids) for group in groups for c in group)
        return {
            "id": f"{prefix}-{uuid.uuid4().hex}",
            "object": kind,
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
            "weight_step": min(c.policy_step for group in groups for c in group),
        }

    def close(self) -> None:
        """Stop the worker thread after the request it is serving; queued requests get a 503."""
        self.worker.shutdown(wait=True, cancel_futures=True)


class Handler(BaseHTTPRequestHandler):
    """Reads the request, hands it to the app, writes its JSON answer (one request per connection)."""

    server: OpenAIServer
    server_version = "grpokit"

    def do_GET(self) -> None:
        self.respond(*self.server.app.handle("GET", self.path, b""))

    def do_POST(self) -> None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            return self.respond(400, RequestError("Content-Length is not an integer").body())
        if length > MAX_BODY_BYTES:
            return self.respond(413, RequestError(f"request body over {MAX_BODY_BYTES} bytes", status=413).body())
        self.respond(*self.server.app.handle("POST", self.path, self.rfile.read(length)))

    def respond(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except ConnectionError:
            log.debug("client left before its answer to %s", self.path)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)


class OpenAIServer(ThreadingHTTPServer):
    """The HTTP server of an OpenAIApp: `serve_forever()` here, or `start()` in a background thread."""

    def __init__(self, app: OpenAIApp, host: str = "127.0.0.1", port: int = 8000) -> None:
        super().__init__((host, port), Handler)
        self.app = app
        self.thread: threading.Thread | None = None
        if not ipaddress.ip_address(self.server_address[0]).is_loopback:
            log.warning("serving on %s: reachable from other machines, with no authentication", self.server_address[0])

    @property
    def url(self) -> str:
        """Base URL for OpenAI clients, e.g. http://127.0.0.1:8000/v1."""
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> OpenAIServer:
        self.thread = threading.Thread(target=self.serve_forever, name="grpokit-server", daemon=True)
        self.thread.start()
        return self

    def close(self) -> None:
        """Stop accepting requests, join the server thread (if started) and the engine thread."""
        if self.thread is not None:
            self.shutdown()
            self.thread.join()
        self.server_close()
        self.app.close()

    def __exit__(self, *exc: object) -> None:
        self.close()


def model_len(engine: InferenceEngine, tokenizer) -> int | None:
    """The engine's context length: its `max_model_len`, its model's position limit, or the tokenizer's."""
    if getattr(engine, "max_model_len", None):
        return engine.max_model_len
    config = getattr(getattr(engine, "model", None), "config", None)
    if getattr(config, "max_position_embeddings", None):
        return config.max_position_embeddings
    limit = getattr(tokenizer, "model_max_length", None)
    return limit if isinstance(limit, int) and limit < 10**7 else None  # HF's "unknown" is ~1e30


def make_app(
    engine: InferenceEngine,
    tokenizer,
    model_name: str = "grpokit",
    broadcast: WeightBroadcast | None = None,
    max_model_len: int | None = None,
) -> OpenAIApp:
    """The server logic for an engine that has been `setup`.

    Args:
        engine: the engine; from here on only the app's worker thread calls it.
        tokenizer: the engine's tokenizer (chat template, decoding).
        model_name: the model id clients pass and `/v1/models` lists.
        broadcast: if given (and `setup`), newer weights are loaded before each request.
        max_model_len: context length; found from the engine or tokenizer when None.
    """
    return OpenAIApp(engine, tokenizer, model_name, broadcast, max_model_len or model_len(engine, tokenizer))


def make_server(app: OpenAIApp, host: str = "127.0.0.1", port: int = 8000) -> OpenAIServer:
    """Bind an HTTP server for `app` (port 0 picks a free port; see `server.url`)."""
    return OpenAIServer(app, host, port)


def serve(
    engine: InferenceEngine,
    tokenizer,
    host: str = "127.0.0.1",
    port: int = 8000,
    model_name: str = "grpokit",
    broadcast: WeightBroadcast | None = None,
    max_model_len: int | None = None,
) -> None:
    """Serve the engine over the OpenAI API until interrupted. Binds to loopback unless `host` says otherwise."""
    server = make_server(make_app(engine, tokenizer, model_name, broadcast, max_model_len), host, port)
    log.info("serving %s at %s", model_name, server.url)
    try:
        server.serve_forever()
    finally:
        server.close()
