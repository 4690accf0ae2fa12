"""An OpenAI-compatible HTTP server in front of any InferenceEngine, so one client serves the builtin
engine and vLLM alike.

Endpoints: `GET /v1/models`, `GET /v1/models/{id}`, `POST /v1/completions`, `POST /v1/chat/completions`,
`GET /health`, vLLM's token-in/token-out `POST /inference/v1/generate`, and grpokit's `GET /v1/weights`.
This module is the API's logic (`OpenAIApp`: routes, checks, answers); grpokit.inference.server.asgi is
the HTTP layer (Starlette on uvicorn), .generation the engine thread's part of a request, .answers and
.stream the answers' shapes, plain and streamed. Request bodies are read by the endpoints' pydantic models
(.requests) and checked against `server.limits` (ServerLimits) on the HTTP side, before any work; a refusal
is a RequestError (.errors). All tokenizer and engine work runs on one engine thread
(grpokit.inference.server.worker) that owns both, from a bounded queue. With a `broadcast`, that thread
loads any newer published weights before each request and before answering `/v1/weights`.

Where it departs from the OpenAI API:
- vLLM extensions: `return_token_ids` adds `prompt_token_ids` (top level for chat, per choice for
  completions) and per-choice `token_ids`; `chat_template_kwargs` is passed to the chat template (a
  template of the request's own only with `server.limits.trust_request_chat_template`).
- Every response carries a top-level `weight_step`: the trainer step of the weights that produced it.
- `GET /v1/weights` answers `{"weight_step"}`, the step the engine holds once it has loaded the newest
  published one: the trainer's progress for an orchestrator whose broadcast only this process may poll
  (NCCLBroadcast, IPCBroadcast); `grpokit infer` adds `run`, its run name, which RemoteEngine checks.
  `?sha256=true` adds the engine's checksum of those weights (InferenceEngine.weights_sha256), to compare
  with the trainer's.
- `GET /health` answers `{"queued", "running_s", "alive"}` (503 once the engine thread has stopped).
- Logprobs are of the temperature-scaled distribution, and so are chat's `top_logprobs` k and
  completions' `logprobs` k (at most server.limits.max_top_logprobs; engines with
  `reports_top_logprobs` only: not the fast CUDA path).
- `min_tokens`, `repetition_penalty` and `stop_token_ids` (vLLM extensions) are honoured, and logprobs
  are of the processed distribution (stop tokens masked, penalty applied, then temperature). A stop token
  id is kept in `token_ids` and left out of the text, as in vLLM.
- `stream: true` (chat and completions) sends server-sent events token by token as the engine decodes
  them (grpokit.inference.server.stream); a client that hangs up cancels its request on the engine.
- `POST /inference/v1/generate` takes and returns token ids (with pictures: vLLM's `content_parts`, below),
  in the shape of vLLM's, as verifiers' train client (renderers.client.generate) reads it: `token_ids`,
  `sampling_params` -> `request_id`,
  `choices[].token_ids`, `.logprobs.content[i] = {token: "token_id:<id>", token_id, logprob, bytes: null,
  top_logprobs}`, `.finish_reason`, `usage`; so one client serves vLLM and grpokit alike. Sampling
  params grpokit cannot honour that change what is sampled are refused; vLLM's that only shape text
  (`skip_special_tokens`, ...) and unknown ones are ignored, as vLLM ignores unknown ones. Errors in
  `sampling_params` name the field without the prefix.
- A published step whose files cannot be read (a truncated adapter) is logged with its path and the
  engine serves on with the weights it holds; `GET /v1/weights` answers that error (500).
- No tools, presence/frequency penalties, logit bias, echo or best_of: a non-default value
  is a 400, never silently ignored. Other unknown fields are ignored, as vLLM does.
- Token ids keep a stop string and the EOS token, as the engine sampled them; `text` and `content`
  end before the stop string, as in OpenAI's API.
- Images, on a vision-language model (grpokit.inference.server.images): chat image parts as `data:` URLs,
  rendered by the model's processor; `/v1/completions`' `vision` field carries token-id prompts' image
  inputs (RemoteEngine); `/inference/v1/generate` takes vLLM's `content_parts` (pictures beside the ids
  before expansion); the model card's `images` says whether the server takes them.
"""

from __future__ import annotations

import logging
import time
import uuid
from urllib.parse import parse_qsl

from grpokit.broadcast import WeightBroadcast
from grpokit.inference import InferenceEngine
from grpokit.inference.server.answers import Answers, finish_reason, generate_answer
from grpokit.inference.server.asgi import OpenAIServer
from grpokit.inference.server.errors import RequestError
from grpokit.inference.server.fields import RequestContext, unknown_model
from grpokit.inference.server.generation import RequestSampler
from grpokit.inference.server.images import ServedImages
from grpokit.inference.server.limits import ServerLimits
from grpokit.inference.server.requests import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    PromptBudget,
    check_rows,
    longest_token_chars,
    parse_json,
)
from grpokit.inference.server.stream import ChatStream, CompletionStream
from grpokit.inference.server.worker import EngineCall, EngineWorker, OnEngine
from grpokit.vision.messages import has_images

log = logging.getLogger(__name__)


class OpenAIApp:
    """The server's logic without the HTTP: `dispatch(method, path, query, body)` checks a request and
    returns its answer, or the OnEngine work that makes it."""

    run_name: str | None = None  # `grpokit infer`'s run: GET /v1/weights names it

    def __init__(
        self,
        engine: InferenceEngine,
        tokenizer,
        model_name: str,
        broadcast: WeightBroadcast | None,
        max_model_len: int | None,
        limits: ServerLimits | None = None,
    ) -> None:
        self.engine, self.tokenizer, self.model_name, self.broadcast = engine, tokenizer, model_name, broadcast
        self.max_model_len = max_model_len
        self.limits = limits or ServerLimits()
        self.context = RequestContext(self.limits, model_name, engine)  # what the request models check against
        self.vocab_size = len(tokenizer)
        self.budget = PromptBudget.of(max_model_len, self.limits.max_prompt_tokens, longest_token_chars(tokenizer))
        self.worker = EngineWorker(self.limits.max_queued_requests)
        self.answers = Answers(tokenizer, model_name)
        self.images = ServedImages(engine, tokenizer, model_name)  # prompts with images
        self.sampler = RequestSampler(
            engine, tokenizer, broadcast, self.max_model_len, self.budget, self.answers, self.images
        )

    def dispatch(self, method: str, path: str, query: str, body: bytes) -> dict | OnEngine:
        """The answer to a request (a RequestError for a refused one), or the engine work that makes it."""
        routes = {
            "/v1/models": ("GET", self.models),
            "/v1/completions": ("POST", self.completions),
            "/v1/chat/completions": ("POST", self.chat_completions),
            "/health": ("GET", self.health),
            "/v1/weights": ("GET", self.weights),
            "/inference/v1/generate": ("POST", self.generate),
        }
        path = path.rstrip("/")
        if path.startswith("/v1/models/"):
            routes[path] = ("GET", lambda _: self.model_card(path.removeprefix("/v1/models/")))
        if path not in routes:
            raise RequestError(f"no route {path}", status=404)
        if method != routes[path][0]:
            raise RequestError(f"{path} takes {routes[path][0]}, not {method}", status=405)
        return routes[path][1](self.parse_body(body) if method == "POST" else dict(parse_qsl(query)))

    def parse_body(self, body: bytes) -> dict:
        """A JSON object; its fields are the endpoint's request model's to check (`model` first)."""
        parsed = parse_json(body)
        if not isinstance(parsed, dict):
            raise RequestError("request body must be a JSON object")
        return parsed

    def check_model(self, model: str) -> None:
        if model != self.model_name:
            raise RequestError(unknown_model(model, self.model_name), "model", 404)

    def model_card(self, model: str | None = None) -> dict:
        if model is not None:
            self.check_model(model)
        card = {
            "id": self.model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "grpokit",
            "root": self.model_name,
        }
        if self.max_model_len is not None:
            card["max_model_len"] = self.max_model_len
        card["images"] = self.images.available  # grpokit's: prompts with images are sampled (RemoteEngine asks)
        return card

    def models(self, _: dict) -> dict:
        return {"object": "list", "data": [self.model_card()], "weight_step": self.engine.weight_step}

    def health(self, _: dict) -> dict:
        return self.worker.health()

    def weights(self, query: dict) -> OnEngine:
        """The step of the weights the engine holds, after loading the newest published one (with
        `max_weight_step=N`, the newest up to step N: the orchestrator's deterministic schedule); with
        `sha256=true`, the engine's checksum of them too."""
        checksum = query.get("sha256", "false")
        if checksum not in ("true", "false"):
            raise RequestError(f"sha256 must be true or false, got {checksum!r}", "sha256")
        upto = query.get("max_weight_step")
        if upto is not None and not (upto.isascii() and upto.isdigit() and len(upto) < 19):
            raise RequestError(f"max_weight_step must be a step number (>= 0), got {upto[:40]!r}", "max_weight_step")

        def work(_: EngineCall) -> dict:
            self.sampler.load_newer_weights(strict=True, upto=None if upto is None else int(upto))
            answer = {"object": "weights", "weight_step": self.engine.weight_step}
            if self.run_name is not None:
                answer["run"] = self.run_name
            if checksum == "true":
                try:
                    answer["sha256"] = self.engine.weights_sha256()
                except NotImplementedError as e:
                    raise RequestError(str(e), "sha256") from None
            return answer

        return OnEngine(work)

    def completions(self, body: dict) -> OnEngine:
        request = CompletionRequest.parse(body, self.context)
        prompts, params, usage = request.prompt, request.params, request.usage
        check_rows(len(prompts), params.n, self.limits.max_rows)
        self.budget.check_prompts(prompts, self.vocab_size)
        self.check_max_tokens(params.max_tokens)
        self.check_stop_token_ids(params.stop_token_ids)
        vision = None
        if request.vision is not None:  # grpokit's: token-id prompts' image inputs (RemoteEngine)
            self.images.check_request(params, "vision")
            if any(isinstance(p, str) for p in prompts):
                raise RequestError("vision takes token-id prompts (with the image placeholders)", "prompt")
            vision = self.images.inputs(request.vision)

        def work(call: EngineCall) -> dict | None:
            ids = [self.tokenizer.encode(p) if isinstance(p, str) else p for p in prompts]  # as vLLM: specials added
            stream = self.sampler.stream_of(CompletionStream, call, ids, params, usage)
            groups = self.sampler.sample(ids, params, "prompt", call, stream, vision)
            if stream is not None:
                return stream.finish(groups)
            choices = []
            for prompt, group in zip(ids, groups):
                for c in group:
                    choice = {
                        "index": len(choices),
                        "text": self.answers.text(c, params.stop, params.stop_token_ids),
                        "logprobs": None,
                        "finish_reason": finish_reason(c),
                    }
                    if params.logprobs:
                        choice["logprobs"] = self.answers.completion_logprobs(c.token_ids, c.logprobs, c.top_logprobs)
                    if params.return_token_ids:
                        choice.update(prompt_token_ids=prompt, token_ids=c.token_ids)
                    choices.append(choice)
            return self.answers.envelope("cmpl", "text_completion", choices, ids, groups)

        return OnEngine(work, stream=usage is not None, priority=params.priority)

    def chat_completions(self, body: dict) -> OnEngine:
        request = ChatCompletionRequest.parse(body, self.context)
        messages, template_kwargs, params = request.messages, request.template_kwargs, request.params
        usage = request.usage
        self.budget.check_messages(messages)
        self.check_max_tokens(params.max_tokens)
        self.check_stop_token_ids(params.stop_token_ids)
        images = has_images(messages)
        if images:
            self.images.check_request(params, "messages")

        def work(call: EngineCall) -> dict | None:
            vision = None
            if images:  # rendered by the model's processor (grpokit.inference.server.images)
                prompt, vision = self.images.render(messages, template_kwargs)
            else:
                prompt = self.sampler.render(messages, template_kwargs)
            stream = self.sampler.stream_of(ChatStream, call, [prompt], params, usage)
            group = self.sampler.sample([prompt], params, "messages", call, stream, vision)[0]
            if stream is not None:
                return stream.finish([group])
            choices = []
            for i, c in enumerate(group):
                message = {"role": "assistant", "content": self.answers.text(c, params.stop, params.stop_token_ids)}
                choice = {"index": i, "message": message, "logprobs": None, "finish_reason": finish_reason(c)}
                if params.logprobs:
                    choice["logprobs"] = {
                        "content": self.answers.chat_logprobs(c.token_ids, c.logprobs, c.top_logprobs)
                    }
                if params.return_token_ids:
                    choice["token_ids"] = c.token_ids
                choices.append(choice)
            response = self.answers.envelope("chatcmpl", "chat.completion", choices, [prompt], [group])
            if params.return_token_ids:
                response["prompt_token_ids"] = prompt
            return response

        return OnEngine(work, stream=usage is not None, priority=params.priority)

    def generate(self, body: dict) -> OnEngine:
        """vLLM's token-in/token-out endpoint (`POST /inference/v1/generate`), as verifiers' train client
        (renderers.client.generate) calls it: `{token_ids, sampling_params, model?, request_id?,
        return_token_ids?, content_parts?}` -> `{request_id, model, created, choices: [{index, token_ids,
        logprobs: {content} | null, finish_reason}], usage, prompt_logprobs: null, prompt_token_ids}`, plus
        grpokit's `weight_step`. No text on either side: each logprob names its token `token_id:<id>`. With
        `content_parts` (pictures), `token_ids` are the ids before expansion and the answer adds
        `mm_placeholders` (grpokit.inference.server.images)."""
        request = GenerateRequest.parse(body, self.context)
        prompt, params, k = request.token_ids, request.sampling_params.params, request.sampling_params.logprobs
        request_id, return_prompt, sources = request.request_id or uuid.uuid4().hex, request.return_token_ids, None
        check_rows(1, params.n, self.limits.max_rows)
        self.budget.check_prompts([prompt], self.vocab_size, "token_ids")
        self.check_max_tokens(params.max_tokens)  # null: the rest of the context
        self.check_stop_token_ids(params.stop_token_ids)
        if request.content_parts is not None:  # pictures, with the ids before expansion
            self.images.check_request(params, "content_parts")
            sources = request.content_parts

        def work(call: EngineCall) -> dict:
            ids, vision, spans = prompt, None, None
            if sources is not None:  # placeholders expanded by the model's processor
                ids, vision, spans = self.images.expand(prompt, sources)
            group = self.sampler.sample([ids], params, "token_ids", call, None, vision)[0]
            answer = generate_answer(request_id, self.model_name, ids, group, k, return_prompt)
            if spans is not None:
                answer["mm_placeholders"] = {"image": [{"offset": at, "length": n} for at, n in spans]}
            return answer

        return OnEngine(work)

    def check_stop_token_ids(self, ids: list[int]) -> None:
        if any(t >= self.vocab_size for t in ids):
            raise RequestError(f"stop_token_ids must be in [0, {self.vocab_size})", "stop_token_ids")

    def check_max_tokens(self, max_tokens: int | None) -> None:
        """max_tokens alone against the context (a prompt has at least one token), before any work."""
        if self.max_model_len is not None and max_tokens is not None and max_tokens >= self.max_model_len:
            raise RequestError(
                f"this model's context is {self.max_model_len} tokens: max_tokens={max_tokens} leaves no room "
                "for the prompt",
                "max_tokens",
            )

    def close(self, timeout: float | None = None) -> bool:
        """Stop the engine thread: queued requests get a 503, the running one `timeout` seconds
        (server.limits.shutdown_timeout when None). True when the thread has ended."""
        return self.worker.close(self.limits.shutdown_timeout if timeout is None else timeout)


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
    limits: ServerLimits | None = None,
) -> OpenAIApp:
    """The server logic for an engine that has been `setup`.

    Args:
        engine: the engine; from here on only the app's engine thread calls it.
        tokenizer: the engine's tokenizer (chat template, decoding).
        model_name: the model id clients pass and `/v1/models` lists.
        broadcast: if given (and `setup`), newer weights are loaded before each request.
        max_model_len: context length; found from the engine or tokenizer when None.
        limits: what one request may cost and how the server behaves under load (ServerLimits()).
    """
    return OpenAIApp(engine, tokenizer, model_name, broadcast, max_model_len or model_len(engine, tokenizer), limits)


def make_server(
    app: OpenAIApp,
    host: str = "127.0.0.1",
    port: int = 8000,
    allowed_hosts: list[str] | None = None,
    allowed_origins: list[str] | tuple[str, ...] = (),
) -> OpenAIServer:
    """Bind an HTTP server for `app` (port 0 picks a free port; see `server.url`); the Host and Origin
    headers it answers: grpokit.inference.server.browsers."""
    return OpenAIServer(app, host, port, allowed_hosts, allowed_origins)


def serve(
    engine: InferenceEngine,
    tokenizer,
    host: str = "127.0.0.1",
    port: int = 8000,
    model_name: str = "grpokit",
    broadcast: WeightBroadcast | None = None,
    max_model_len: int | None = None,
    limits: ServerLimits | None = None,
) -> None:
    """Serve the engine over the OpenAI API until SIGTERM or SIGINT (graceful: answers in flight get
    `limits.shutdown_timeout` seconds). Binds to loopback unless `host` says otherwise."""
    server = make_server(make_app(engine, tokenizer, model_name, broadcast, max_model_len, limits), host, port)
    log.info("serving %s at %s", model_name, server.url)
    try:
        server.serve_forever()
    finally:
        server.close()
