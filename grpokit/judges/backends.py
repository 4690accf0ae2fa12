"""Where a judge runs: its own frozen model in this process, or an OpenAI-compatible server.

Both take a batch of rendered prompts (one step's requests, or a group's) and return one JudgeReply per
prompt, never raising for what a judge can do wrong at run time: a reply that did not come (the batch
ran past its `timeout`: "timeout"; the server refused, was unreachable or answered something that is not
a chat completion after every retry: "down") is an outcome the failure policy of grpokit.judges.reward
acts on, counted and logged. Settings errors (an API key variable that is not set) raise at build time.

- BuiltinJudge: a BuiltinEngine of its own (its own copy of the judge's weights, never the policy's, no
  gradients, never sent weight updates), sampling greedily by default; the whole batch is one `generate`
  call. Its timeout cancels the batch between decode steps (ServingOptions.cancelled).
- HTTPJudge: POST {base_url}/chat/completions (`grpokit judge`, grpokit infer, vLLM, or any
  OpenAI-compatible endpoint), the requests of a batch sent concurrently; the key is read from the
  environment variable the recipe names, never from the recipe. Connection errors, timeouts, 429 and 5xx
  are retried `retries` times with exponential backoff; redirects are refused (they would carry the key
  elsewhere), as RemoteEngine does (grpokit.judges.posting).
"""

from __future__ import annotations

import json
import logging
import threading
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from grpokit.inference import SamplingSettings, ServingOptions
from grpokit.judges.posting import Failure, json_headers, post_json

log = logging.getLogger(__name__)


@dataclass
class JudgeReply:
    """One prompt's answer: its text, or `failure` ("timeout", "down") with `detail` when none came."""

    text: str | None
    failure: str | None = None
    detail: str = ""


class JudgeBackend(ABC):
    """A model that answers judge prompts. `identity` names it in the cache key (a reply is reused only for
    the same judge), `timeout` bounds a batch (builtin) or a request (HTTP), in seconds."""

    identity: str

    @abstractmethod
    def ask(self, prompts: list[str]) -> list[JudgeReply]:
        """One reply per prompt, in order."""


class BuiltinJudge(JudgeBackend):
    """The judge's own model on grpokit's builtin engine, in this process (loaded at the first batch)."""

    def __init__(
        self, model: str, max_tokens: int = 256, temperature: float = 0.0, timeout: float = 600.0, device: str = "auto"
    ) -> None:
        self.model, self.timeout, self.device = model, timeout, device
        self.sampling = SamplingSettings(temperature=temperature, max_tokens=max_tokens, seed=0)
        self.identity = f"builtin:{model}:t={temperature:g}:max={max_tokens}"
        self.engine = None

    def setup(self) -> None:
        """Load the judge's model: a BuiltinEngine of its own, frozen (no weight updates ever reach it)."""
        from grpokit.inference.builtin import BuiltinEngine

        self.engine = BuiltinEngine(device=self.device, fast="off")
        self.engine.setup(self.model)
        self.engine.model.requires_grad_(False)

    def prompt_ids(self, prompt: str) -> list[int]:
        """The prompt as the judge's chat template renders one user turn (plain text without a template)."""
        tokenizer = self.engine.tokenizer
        if tokenizer.chat_template:
            messages = [{"role": "user", "content": prompt}]
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
            return list(ids)  # as grpokit's server renders a chat request
        return tokenizer.encode(prompt)

    def ask(self, prompts: list[str]) -> list[JudgeReply]:
        if self.engine is None:
            self.setup()
        cancelled = threading.Event()
        timer = threading.Timer(self.timeout, cancelled.set)
        timer.start()
        try:
            groups = self.engine.generate(
                [self.prompt_ids(p) for p in prompts], 1, self.sampling, ServingOptions(cancelled=cancelled)
            )
        finally:
            timer.cancel()
        if cancelled.is_set():
            detail = f"the judge batch of {len(prompts)} ran past judge.timeout ({self.timeout:g}s)"
            return [JudgeReply(None, "timeout", detail) for _ in prompts]
        decode = self.engine.tokenizer.decode
        return [JudgeReply(decode(g[0].token_ids, skip_special_tokens=True)) for g in groups]


class HTTPJudge(JudgeBackend):
    """A judge behind an OpenAI-compatible chat completions endpoint."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_var: str | None = None,
        max_tokens: int = 256,
        temperature: float = 0.0,
        timeout: float = 60.0,
        retries: int = 2,
        max_concurrency: int = 8,
    ) -> None:
        self.headers = json_headers(api_key_var)
        if retries < 0 or timeout <= 0 or max_concurrency < 1:
            raise ValueError("judge: retries must be >= 0, timeout > 0 and max_concurrency >= 1")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.timeout, self.retries, self.max_concurrency = model, timeout, retries, max_concurrency
        self.body = {"model": model, "max_tokens": max_tokens, "temperature": temperature, "seed": 0}
        self.identity = f"http:{base_url}:{model}:t={temperature:g}:max={max_tokens}"

    def ask(self, prompts: list[str]) -> list[JudgeReply]:
        with ThreadPoolExecutor(min(self.max_concurrency, max(1, len(prompts)))) as pool:
            return list(pool.map(self._ask_one, prompts))

    def _ask_one(self, prompt: str) -> JudgeReply:
        """One request, retried on what a retry may cure (grpokit.judges.posting); the reply, or the failure."""
        payload = {**self.body, "messages": [{"role": "user", "content": prompt}]}
        out = post_json(
            self.url, payload, self.headers, self.timeout, self.retries, lambda raw: reply_of(raw, self.url)
        )
        return JudgeReply(None, out.kind, out.detail) if isinstance(out, Failure) else out


def reply_of(raw: bytes, url: str) -> JudgeReply:
    """The text of a chat completion answer; ValueError naming the server for anything else."""
    try:
        answer = json.loads(raw)
        text = answer["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise ValueError(f"{url} answered {raw[:200]!r}: not a chat completion") from None
    if not isinstance(text, str):
        raise ValueError(f"{url} answered a message whose content is {text!r}, not text")
    return JudgeReply(text)
