"""A judge on a server of its own: what `grpokit judge` serves (the fourth role of a multi-process run).

The judge's model runs in a process apart from the policy's: a frozen copy, never sent a weight update,
on whatever device the judge's settings name (`judge.device`), answering the orchestrator's requests at
the address of the judge's `base_url`.

- A generative judge (`kind: http`): grpokit's OpenAI-compatible server (grpokit.inference.server.http)
  over a BuiltinEngine of the judge's model, with no broadcast: HTTPJudge asks its `/v1/chat/completions`
  as it would vLLM's. The served model name is `judge.model`, the name HTTPJudge sends.
- A classifier reward model (`kind: classifier`): `RewardModelApp` below, served by the same HTTP layer
  (grpokit.inference.server.asgi: loopback by default, the Host/Origin guard, the body and queue limits,
  graceful SIGTERM): `GET /v1/models`, `GET /health` and `POST /v1/rewards` (grpokit.judges.remote_classifier
  has its shape). Its conversations are scored one request at a time on the server's engine thread, by
  the ClassifierReward the in-process judge uses, so the scores are the same model's.

vLLM serves the generative kind too (chat completions); its pooling endpoints are not this API, so a
classifier on vLLM is not supported here.
"""

from __future__ import annotations

import math
import time
from typing import Any
from urllib.parse import parse_qsl, urlparse

from grpokit.inference.server.asgi import OpenAIServer
from grpokit.inference.server.errors import RequestError
from grpokit.inference.server.fields import unknown_model
from grpokit.inference.server.http import make_app
from grpokit.inference.server.limits import ServerLimits
from grpokit.inference.server.requests import parse_json
from grpokit.inference.server.worker import EngineCall, EngineWorker, OnEngine
from grpokit.judges.classifier import ClassifierReward
from grpokit.judges.reward import JudgeSettings


class RewardModelApp:
    """The reward-model API without the HTTP (a ServedApp of grpokit.inference.server.asgi)."""

    def __init__(self, classifier: ClassifierReward, model_name: str, limits: ServerLimits | None = None) -> None:
        self.classifier, self.model_name = classifier, model_name
        self.limits = limits or ServerLimits()
        self.worker = EngineWorker(self.limits.max_queued_requests, name="grpokit-judge")

    def dispatch(self, method: str, path: str, query: str, body: bytes) -> dict | OnEngine:
        """The answer to a request (a RequestError for a refused one), or the engine work that makes it."""
        routes = {
            "/v1/models": ("GET", self.models),
            "/health": ("GET", self.health),
            "/v1/rewards": ("POST", self.rewards),
        }
        path = path.rstrip("/")
        if path not in routes:
            raise RequestError(f"no route {path}", status=404)
        if method != routes[path][0]:
            raise RequestError(f"{path} takes {routes[path][0]}, not {method}", status=405)
        return routes[path][1](parse_json(body) if method == "POST" else dict(parse_qsl(query)))

    def models(self, _: dict) -> dict:
        card = {"id": self.model_name, "object": "model", "created": int(time.time()), "owned_by": "grpokit"}
        return {"object": "list", "data": [card]}

    def health(self, _: dict) -> dict:
        return self.worker.health()

    def rewards(self, body: Any) -> OnEngine:
        """Score `conversations` (each a list of chat messages) with the reward model, in order."""
        conversations = checked_conversations(body, self.model_name, self.limits.max_rows)

        def work(_: EngineCall) -> dict:
            try:
                scores = self.classifier.score(conversations)
            except Exception as e:  # a message the reward model's chat template cannot render
                if type(e).__module__.startswith("jinja2"):
                    raise RequestError(f"conversations: the reward model's chat template failed: {e}") from None
                raise
            return {
                "object": "list",
                "model": self.model_name,
                "scores": [s if math.isfinite(s) else None for s in scores],  # JSON has no NaN
            }

        return OnEngine(work)

    def close(self, timeout: float | None = None) -> bool:
        return self.worker.close(self.limits.shutdown_timeout if timeout is None else timeout)


def checked_conversations(body: Any, model_name: str, max_rows: int) -> list[list[dict[str, Any]]]:
    """The request's conversations, or a RequestError naming the field that is wrong."""
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    if body.get("model") != model_name:
        raise RequestError(unknown_model(str(body.get("model")), model_name), "model", 404)
    conversations = body.get("conversations")
    if not isinstance(conversations, list) or not 1 <= len(conversations) <= max_rows:
        raise RequestError(
            f"conversations must be a list of 1 to {max_rows} conversations (server.limits.max_rows)", "conversations"
        )
    for i, conversation in enumerate(conversations):
        if not isinstance(conversation, list) or not conversation:
            raise RequestError(f"conversations[{i}] must be a non-empty list of messages", "conversations")
        for j, message in enumerate(conversation):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise RequestError(
                    f"conversations[{i}][{j}] must be a message: an object with a string role", "conversations"
                )
    return conversations


def judge_app(settings: JudgeSettings, limits: ServerLimits | None = None):
    """The app that serves the judge of `settings`, its model loaded (a ServedApp)."""
    if settings.kind == "classifier":
        classifier = ClassifierReward(settings.model, device=settings.in_process_device)
        classifier.setup()
        return RewardModelApp(classifier, settings.model, limits)
    from grpokit.inference.builtin import BuiltinEngine

    engine = BuiltinEngine(device=settings.device, fast="off")
    engine.setup(settings.model)
    engine.model.requires_grad_(False)
    return make_app(engine, engine.tokenizer, settings.model, broadcast=None, limits=limits)


def judge_server(
    settings: JudgeSettings, host: str, port: int, limits: ServerLimits | None = None, **guard: Any
) -> OpenAIServer:
    """The judge's HTTP server bound at host:port (port 0: a free one; see `.url`); `guard`: the
    allowed_hosts / allowed_origins of grpokit.inference.server.browsers."""
    return OpenAIServer(judge_app(settings, limits), host, port, **guard)


def served_judge(recipe: dict[str, Any], name: str | None = None) -> tuple[JudgeSettings, tuple[str, int]]:
    """The judge a resolved recipe serves with `grpokit judge`: the one judge of `data.env` (and
    `data.eval.env`) with a `base_url` (or the one named `name`), and the host and port of that URL.
    A ValueError naming the key when there is none, or several and no name."""
    data = recipe.get("data") or {}
    entries = [*(data.get("env") or []), *((data.get("eval") or {}).get("env") or [])]
    judges: dict[str, JudgeSettings] = {}
    for entry in entries:
        value = entry.get("judge")
        for one in value if isinstance(value, list) else [value] if value is not None else []:
            settings = JudgeSettings.from_recipe(one, f"data.env {entry.get('id')!r}")
            if settings.base_url and (name is None or settings.name == name):
                judges.setdefault(settings.base_url, settings)
    if not judges:
        which = f" named {name!r}" if name is not None else ""
        raise ValueError(
            f"the recipe has no judge{which} with a base_url to serve: set data.env[i].judge.base_url "
            "(e.g. http://127.0.0.1:8100/v1) to the address `grpokit judge` listens at and the orchestrator asks"
        )
    if len(judges) > 1:
        names = sorted(s.name for s in judges.values())
        raise ValueError(f"the recipe's judges {names} are served at different base_urls: pick one with --name NAME")
    (settings,) = judges.values()
    return settings, address_of(settings.base_url)


def address_of(base_url: str) -> tuple[str, int]:
    """The host and port a judge's base_url names (http only: the server has no TLS)."""
    url = urlparse(base_url)
    if url.scheme != "http" or not url.hostname or url.port is None:
        raise ValueError(
            f"judge.base_url {base_url!r}: `grpokit judge` serves plain http at an explicit host and port, "
            "e.g. http://127.0.0.1:8100/v1"
        )
    if url.path.rstrip("/") not in ("", "/v1"):
        raise ValueError(f"judge.base_url {base_url!r}: `grpokit judge` serves at the path /v1")
    return url.hostname, url.port
