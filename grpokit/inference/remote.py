"""RemoteEngine: an InferenceEngine that talks to OpenAI-compatible servers (grpokit's own or vLLM).

Requests go to `/v1/completions` with the prompt as token ids and the vLLM extensions the orchestrator
needs: `logprobs: 0` (only the sampled token's logprob), `return_token_ids: true` (the completion's token
ids), `min_tokens` and `repetition_penalty` when set, and grpokit's `weight_step` in the response. The
servers load new weights themselves (grpokit's server polls the broadcast before each request; vLLM
reloads the LoRA adapter), so `load_weights` only records the step the orchestrator waited for. Several
`base_url`s spread the prompts round-robin.
`served_weight_step` asks every server (`GET /v1/weights`, grpokit's server only) which step it holds:
the orchestrator's progress source when the broadcast is one only the servers may poll (NCCL, IPC).
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from grpokit.inference import Completion, InferenceEngine, SamplingSettings
from grpokit.types import WeightUpdate

log = logging.getLogger(__name__)


class RemoteEngine(InferenceEngine):
    """Client of one or more OpenAI-compatible completion servers (grpokit infer, or vLLM)."""

    applies_norm_weights = (
        True  # grpokit's server loads the broadcast's updates, noisy norms included, into its own engine
    )
    servers_load_weights = True

    def __init__(
        self,
        base_url: list[str] | str = "http://127.0.0.1:8000/v1",
        model_name: str = "grpokit",
        api_key_var: str | None = None,
        timeout: float = 600.0,
        max_retries: int = 5,
        max_concurrency: int = 8,
    ) -> None:
        """
        Args:
            base_url: one server URL or a list of them (ending in /v1); requests are spread across them.
            model_name: the `model` field of requests (the server's served model name or LoRA name).
            api_key_var: name of the environment variable holding the API key (never the key itself).
            timeout: seconds per request.
            max_retries: retries with exponential backoff on connection errors and 5xx answers.
            max_concurrency: requests in flight at once.
        """
        self.base_urls = [base_url] if isinstance(base_url, str) else list(base_url)
        if not self.base_urls:
            raise ValueError("inference.init_args.base_url needs at least one server URL")
        self.model_name, self.timeout, self.max_retries, self.max_concurrency = (
            model_name,
            timeout,
            max_retries,
            max_concurrency,
        )
        self.api_key_var = api_key_var
        self.weight_step = -1
        self.server_weight_step = -1

    def setup(self, model: str) -> None:
        self._headers = {"Content-Type": "application/json"}
        if self.api_key_var:
            key = os.environ.get(self.api_key_var)
            if not key:
                raise ValueError(f"inference.init_args.api_key_var names ${self.api_key_var}, which is not set")
            self._headers["Authorization"] = f"Bearer {key}"

    def load_weights(self, update: WeightUpdate) -> None:
        self.weight_step = update.step  # the servers load the same update from the broadcast themselves

    def served_weight_step(self) -> int:
        """The oldest weights any server holds (each loads the newest published step first): every server
        samples with weights of at least this step."""
        return min(self._weight_step_of(url) for url in self.base_urls)

    def _weight_step_of(self, url: str) -> int:
        try:
            raw = self._call(url, "weights")
        except RemoteError as e:
            if e.code != 404:
                raise
            raise RemoteError(
                f"{url} has no /v1/weights, so it is not grpokit's server: with a broadcast only the server may "
                "poll (broadcast: NCCLBroadcast or IPCBroadcast) the orchestrator learns the trainer's progress "
                "from `grpokit infer`. Serve with `grpokit infer`, or use broadcast: FilesystemBroadcast.",
                404,
            ) from e
        try:
            step = json.loads(raw).get("weight_step")
        except (json.JSONDecodeError, AttributeError):
            step = None
        if not isinstance(step, int) or isinstance(step, bool):
            raise ValueError(
                f"inference server {url} answered {raw[:200]!r} to GET /v1/weights: no integer weight_step"
            )
        return step

    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingSettings) -> list[list[Completion]]:
        bodies = [self._body(ids, n, sampling, i) for i, ids in enumerate(prompts)]
        with ThreadPoolExecutor(max_workers=self.max_concurrency) as pool:
            answers = list(
                pool.map(self._post, [(self.base_urls[i % len(self.base_urls)], b) for i, b in enumerate(bodies)])
            )
        return [
            [
                self._completion(choice, answer, sampling)
                for choice in sorted(answer["choices"], key=lambda c: c["index"])
            ]
            for answer in answers
        ]

    def _body(self, prompt_ids: list[int], n: int, sampling: SamplingSettings, index: int) -> dict:
        body = {
            "model": self.model_name,
            "prompt": prompt_ids,
            "n": n,
            "max_tokens": sampling.max_tokens,
            "temperature": 1.0 if sampling.temperature is None else sampling.temperature,
            "top_p": sampling.top_p,
            "stop": sampling.stop or None,
            "seed": (sampling.seed or 0) * 100_003 + index,
            "logprobs": 0,
            "return_token_ids": True,
        }
        if sampling.min_tokens:  # vLLM extensions, sent only when set so plain OpenAI servers still work
            body["min_tokens"] = sampling.min_tokens
        if sampling.repetition_penalty != 1.0:
            body["repetition_penalty"] = sampling.repetition_penalty
        return body

    def _completion(self, choice: dict, answer: dict, sampling: SamplingSettings) -> Completion:
        token_ids = list(choice.get("token_ids") or [])
        logprobs = list((choice.get("logprobs") or {}).get("token_logprobs") or [])
        if len(logprobs) != len(token_ids):
            raise ValueError(
                f"server answered {len(token_ids)} token ids but {len(logprobs)} "
                "logprobs: it must support logprobs and return_token_ids"
            )
        step = answer.get("weight_step")
        self.server_weight_step = self.weight_step if step is None else int(step)
        return Completion(
            token_ids, [float(x) for x in logprobs], choice.get("finish_reason") == "length", self.server_weight_step
        )

    def _post(self, url_body: tuple[str, dict]) -> dict:
        url, body = url_body
        raw = self._call(url, "completions", body)
        try:
            answer = json.loads(raw)
        except json.JSONDecodeError:
            answer = None
        if not isinstance(answer, dict) or not isinstance(answer.get("choices"), list):
            raise ValueError(
                f"inference server {url} answered {raw[:200]!r}: not a "
                "completions answer (a JSON object with a 'choices' list)"
            )
        return answer

    def _call(self, url: str, endpoint: str, body: dict | None = None) -> bytes:
        """POST `body` to `{url}/{endpoint}` (GET without a body); returns the raw answer.

        A server that is down, restarting, drops the connection or cuts its answer short (connection
        errors, timeouts, http.client errors, 5xx answers) is retried max_retries times with exponential
        backoff (0.5 s, 1 s, 2 s, ... at most 30 s apart), then reported with an error naming it.
        """
        data = None if body is None else json.dumps(body).encode()
        for attempt in range(self.max_retries + 1):
            request = urllib.request.Request(
                f"{url.rstrip('/')}/{endpoint}",
                data=data,
                headers=self._headers,
                method="GET" if body is None else "POST",
            )
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    return response.read()
            except urllib.error.HTTPError as e:
                if e.code < 500 or attempt == self.max_retries:
                    raise RemoteError(f"{url}/{endpoint} answered {e.code}: {e.read()[:500]!r}", e.code) from e
            except (urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException) as e:
                if attempt == self.max_retries:
                    raise ConnectionError(
                        f"inference server {url} failed {self.max_retries + 1} tries "
                        f"({type(e).__name__}: {e}): is `grpokit infer` (or vLLM) serving there? "
                        "Retries and the per-request limit are inference.init_args.max_retries "
                        f"({self.max_retries}) and inference.init_args.timeout ({self.timeout:g}s)."
                    ) from e
            delay = min(30.0, 0.5 * 2**attempt)
            log.warning(
                "request to %s/%s failed (try %d of %d), retrying in %.1fs",
                url,
                endpoint,
                attempt + 1,
                self.max_retries + 1,
                delay,
            )
            time.sleep(delay)
        raise AssertionError("unreachable")


class RemoteError(RuntimeError):
    """A server answered an HTTP error; `code` is its status."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code
