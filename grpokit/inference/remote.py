"""RemoteEngine: an InferenceEngine that talks to OpenAI-compatible servers (grpokit's own or vLLM).

Requests go to `/v1/completions` with the prompt as token ids and the vLLM extensions the orchestrator
needs: `logprobs: 0` (only the sampled token's logprob), `return_token_ids: true` (the completion's token
ids), `min_tokens`, `repetition_penalty` and `stop_token_ids` when set, and grpokit's `weight_step` in the
response. The servers load new weights themselves (grpokit's server polls the broadcast before each
request; vLLM reloads the LoRA adapter), so `load_weights` only records the step the orchestrator waited
for. Several `base_url`s spread the prompts round-robin.
`served_weight_step` asks every server (`GET /v1/weights`, grpokit's server only) which step it holds:
the orchestrator's progress source when the broadcast is one only the servers may poll (NCCL, IPC).
Prompts with images (`samples_images`, grpokit's server only): a group's image inputs go with its token
ids as grpokit's `vision` field (grpokit.vision.inputs.to_base64, the tensors the trainer scores with;
grpokit.inference.server.images says why not the pictures), once its server has said it takes images.

A server is trusted with nothing: redirects are refused (a redirect would carry the API key to another
address); every answer is checked before it becomes rollouts (n choices per prompt with indices 0..n-1,
token ids in the vocabulary, no more than max_tokens of them, as many logprobs, none above 0; NaN or
infinite logprobs pass on to the orchestrator, which masks and counts them), and an answer that fails
names the server and what was wrong. Busy servers (429, 503) and failures (5xx, connection errors) are
retried with exponential backoff, waiting at least what a Retry-After header asks (at most 60 s).
"""

from __future__ import annotations

import email.utils
import http.client
import itertools
import json
import logging
import math
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from transformers import AutoTokenizer

from grpokit.common.errors import RunDataError
from grpokit.common.models import resolve_model
from grpokit.common.waits import check_seconds
from grpokit.inference import Completion, InferenceEngine, SamplingSettings, server_finish_reason
from grpokit.types import WeightUpdate
from grpokit.vision.inputs import to_base64

log = logging.getLogger(__name__)
T = TypeVar("T")
MAX_RETRY_AFTER = 60.0  # seconds: the longest a server's Retry-After may hold a retry back
LOGPROB_TOLERANCE = 1e-3  # float rounding may leave a logprob of a near-certain token just above 0


class NoRedirects(urllib.request.HTTPRedirectHandler):
    """Every 3xx answer is an HTTPError: a redirect would send the request, API key included, elsewhere."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


OPENER = urllib.request.build_opener(NoRedirects)


class RemoteEngine(InferenceEngine):
    """Client of one or more OpenAI-compatible completion servers (grpokit infer, or vLLM)."""

    applies_norm_weights = (
        True  # grpokit's server loads the broadcast's updates, noisy norms included, into its own engine
    )
    servers_load_weights = True
    takes_vision = True  # generate(..., vision=) and the streams send a group's image inputs
    later_turn_images = True  # a request's `vision` is its whole sequence's: a later turn's pictures go too
    run_name: str | None = None  # the run's (grpokit.run.start_engine): a server naming another run is refused

    def __init__(
        self,
        base_url: list[str] | str = "http://127.0.0.1:8000/v1",
        model_name: str = "grpokit",
        api_key_var: str | None = None,
        timeout: float = 600.0,
        max_retries: int = 5,
        max_concurrency: int = 8,
        vocab_size: int | None = None,
        continuation_priority: int | None = -1,
    ) -> None:
        """
        Args:
            base_url: one server URL or a list of them (ending in /v1); requests are spread across them.
            model_name: the `model` field of requests (the server's served model name or LoRA name).
            api_key_var: name of the environment variable holding the API key (never the key itself).
            timeout: seconds per request.
            max_retries: retries with exponential backoff on connection errors, 429 and 5xx answers.
            max_concurrency: requests in flight at once.
            vocab_size: token ids a server may answer are below this; null = the length of the model's
                tokenizer, read from disk at the first generate.
            continuation_priority: vLLM's `priority` field (lower is served first) on the requests that
                continue a streamed request an update aborted (grpokit.inference.interrupting), so that
                a server that runs requests in turn (`grpokit infer`) does not queue the oldest group
                behind the ones sent after it; null sends none (a vLLM server refuses it unless started
                with --scheduling-policy priority).
        """
        self.base_urls = [base_url] if isinstance(base_url, str) else list(base_url)
        if not self.base_urls:
            raise ValueError("inference.init_args.base_url needs at least one server URL")
        check_seconds("inference.init_args.timeout", timeout)
        self.model_name, self.timeout, self.max_retries, self.max_concurrency = (
            model_name,
            timeout,
            max_retries,
            max_concurrency,
        )
        self.api_key_var = api_key_var
        self.vocab_size = vocab_size
        self.continuation_priority = continuation_priority
        self._vocab_looked_up = False
        self._model: str | None = None  # the model name setup got, for the tokenizer's vocabulary
        self.weight_step = -1
        self.server_weight_step = -1
        # data.deterministic (grpokit.orchestrator.weights.WeightSchedule sets it): each request to a grpokit
        # server asks for weights of at most `weight_step` (`max_weight_step`), so no server samples with
        # newer weights than the schedule names though the trainer has published them
        self.pin_weights = False
        self._grpokit_servers: set[str] = set()  # servers whose GET /v1/weights answered a weight_step
        self._runs_checked: set[str] = set()  # servers whose run (GET /v1/weights) was checked against run_name
        self._image_servers: set[str] = set()  # servers whose GET /v1/models said they take images
        self._run_lock = threading.Lock()
        self._turns = itertools.count()  # requests are spread round-robin, across calls too (streams)
        self._lanes: dict[str, ThreadPoolExecutor] = {}  # data.deterministic: one sender per server (send_in_order)
        self._lanes_lock = threading.Lock()

    def setup(self, model: str) -> None:
        self._headers = {"Content-Type": "application/json"}
        if self.api_key_var:
            key = os.environ.get(self.api_key_var)
            if not key:
                raise ValueError(f"inference.init_args.api_key_var names ${self.api_key_var}, which is not set")
            self._headers["Authorization"] = f"Bearer {key}"
        self._model = model

    def load_weights(self, update: WeightUpdate) -> None:
        self.weight_step = update.step  # the servers load the same update from the broadcast themselves

    def served_weight_step(self, upto: int | None = None) -> int:
        """The oldest weights any server holds (each loads the newest published step first, or the newest
        up to `upto`): every server samples with weights of at least this step. With pin_weights each
        server is asked on its lane, after the requests sent to it before (a deterministic stream's ask
        for older steps, which the server would refuse once it holds a newer one)."""
        if self.pin_weights:
            asks = [self._lane(url).submit(self._weight_step_of, url, upto) for url in self.base_urls]
            return min(ask.result() for ask in asks)
        return min(self._weight_step_of(url, upto) for url in self.base_urls)

    def _weights_endpoint(self, upto: int | None) -> str:
        return "weights" if upto is None else f"weights?max_weight_step={int(upto)}"

    def _check_run(self, url: str, upto: int | None = None) -> None:
        """Once per server, before its first request (the worker threads wait for the one that asks):
        refuse a grpokit server of another run. A server whose /v1/weights names no run (vLLM, another
        OpenAI-compatible server: an HTTP error or another answer) passes. `upto`: the request's
        max_weight_step, so the check loads no newer weights than the request asks for."""
        with self._run_lock:
            if url in self._runs_checked:
                return
            try:
                answer = json.loads(self._call(url, self._weights_endpoint(upto)))
            except (RemoteError, json.JSONDecodeError):
                answer = None
            if isinstance(answer, dict) and _is_int(answer.get("weight_step")):
                self._grpokit_servers.add(url)
            self._refuse_other_run(url, answer.get("run") if isinstance(answer, dict) else None)

    def _refuse_other_run(self, url: str, run) -> None:
        """Raise RunDataError if `run` (a server's GET /v1/weights) is not this run; else mark it checked."""
        if self.run_name is not None and run is not None and run != self.run_name:
            raise RunDataError(  # its weights are another run's: a step ahead or behind, trained on either way
                f"inference server {url} serves run {run!r}, this orchestrator's run is {self.run_name!r}: start "
                f"`grpokit infer` with --run_name {self.run_name} (and this recipe), or point "
                "inference.init_args.base_url at that run's server"
            )
        self._runs_checked.add(url)

    def _weight_step_of(self, url: str, upto: int | None = None) -> int:
        try:
            raw = self._call(url, self._weights_endpoint(upto))
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
            answer = json.loads(raw)
            step, run = answer.get("weight_step"), answer.get("run")
        except (json.JSONDecodeError, AttributeError):
            step = run = None
        if not isinstance(step, int) or isinstance(step, bool):
            raise ValueError(
                f"inference server {url} answered {raw[:200]!r} to GET /v1/weights: no integer weight_step"
            )
        self._refuse_other_run(url, run)
        self._grpokit_servers.add(url)
        return step

    def _vocabulary(self) -> int | None:
        """vocab_size, or else the length of the model's tokenizer, read once from disk (the orchestrator
        has loaded it by the first generate, so a hub id is in the local cache); None if it is not there."""
        if self.vocab_size is None and not self._vocab_looked_up:
            self._vocab_looked_up = True
            try:
                path = resolve_model(self._model)
                self.vocab_size = len(AutoTokenizer.from_pretrained(path, local_files_only=True))
            except (OSError, ValueError) as e:
                log.warning(
                    "RemoteEngine: no local tokenizer for %r (%s): the servers' token ids are not checked against "
                    "a vocabulary; set inference.init_args.vocab_size",
                    self._model,
                    str(e).splitlines()[0],
                )
        return self.vocab_size

    def open_stream(
        self, sampling: SamplingSettings, max_rows: int, on_update: str = "continue", max_len: int | None = None
    ):
        """One request per group, max_concurrency in flight, each group back as it is answered. `continue`
        and `regenerate`: a weight update aborts the requests in flight and resubmits their continuations
        (grpokit.inference.interrupting.InterruptingStream); `finish`: they finish with the weights they
        were sent with, and the update applies to the requests sent after it (ConcurrentStream).
        With pin_weights (data.deterministic) the stream reproduces bit for bit instead: each server's
        requests in submission order, `finish` semantics, groups back in submission order
        (grpokit.inference.ordered.OrderedStream)."""
        from grpokit.inference.interrupting import InterruptingStream
        from grpokit.inference.ordered import OrderedStream
        from grpokit.inference.streams import ConcurrentStream

        self._vocabulary()
        if self.pin_weights:
            if on_update != "finish":
                log.info("data.deterministic: requests finish on the weights they were sent with (on_update: finish)")
            return OrderedStream(self, sampling, max_rows)
        if on_update == "finish":
            return ConcurrentStream(self, sampling, max_rows, self.max_concurrency)
        return InterruptingStream(self, sampling, max_rows, self.max_concurrency, on_update)

    def next_url(self) -> str:
        """The server for the next request (round-robin)."""
        return self.base_urls[next(self._turns) % len(self.base_urls)]

    @property
    def samples_images(self) -> bool:
        """Whether every server takes prompts with images (`_check_images`: here grpokit's server on a
        vision-language model; VLLMEngine's, vLLM's token-in route); a ValueError names one that does not.
        A server not reachable yet is asked again before its first request with images."""
        try:
            for url in self.base_urls:
                self._check_images(url)
        except ConnectionError as e:
            log.warning("%s: %s; it is asked again before its first prompt with images", type(self).__name__, e)
        return True

    def _check_images(self, url: str) -> None:
        """Once per server: a ValueError unless its GET /v1/models says it samples prompts with images."""
        if url in self._image_servers:
            return
        try:
            answer = json.loads(self._call(url, "models"))
            cards = answer.get("data") if isinstance(answer, dict) and "weight_step" in answer else None
        except (RemoteError, json.JSONDecodeError):
            cards = None
        if not isinstance(cards, list):
            raise ValueError(
                f"inference server {url} is not `grpokit infer`, and RemoteEngine sends prompts with images to "
                "grpokit's server only: serve the vision-language model with `grpokit infer`"
            )
        card = next((c for c in cards if isinstance(c, dict) and c.get("id") == self.model_name), None)
        if card is None or card.get("images") is not True:
            raise ValueError(
                f"`grpokit infer` at {url} does not sample prompts with images (a text-only model, or "
                "BuiltinEngine's fast path): serve a vision-language model with --inference.init_args.fast off"
            )
        self._image_servers.add(url)

    def generate(
        self, prompts: list[list[int]], n: int, sampling: SamplingSettings, vision: list | None = None
    ) -> list[list[Completion]]:
        """n completions per prompt; `vision`: each prompt's image inputs (VisionInputs, or None)."""
        self._vocabulary()
        vision = vision or [None] * len(prompts)
        bodies = [self._body(ids, n, sampling, i, vision[i]) for i, ids in enumerate(prompts)]
        urls = [self.next_url() for _ in bodies]
        if self.pin_weights:
            answers = self._post_in_order(list(zip(urls, bodies)))
        else:
            with ThreadPoolExecutor(max_workers=self.max_concurrency) as pool:
                answers = list(pool.map(self._post, zip(urls, bodies)))
        return [self._group(url, answer, n, sampling) for url, answer in zip(urls, answers)]

    def _post_in_order(self, requests: list[tuple[str, dict]]) -> list[dict]:
        """The answers of `requests`, each server's sent one after another in order (the servers in parallel):
        data.deterministic. A server answers its requests one at a time anyway, and what it computes for
        one may depend on those before it (the builtin engine's prefix cache), so the arrival order is
        part of what must repeat."""
        return [future.result() for future in [self.send_in_order(url, body) for url, body in requests]]

    def send_in_order(self, url: str, body: dict) -> Future:
        """POST `body` to `url` on that server's lane: after every request sent there before, from any
        caller (a whole batch, an OrderedStream, an evaluation), so a server's arrival order is the
        order of these calls. The answer (`_post`) as a future."""
        return self._lane(url).submit(self._post, (url, body))

    def _lane(self, url: str) -> ThreadPoolExecutor:
        """The one thread that sends `url`'s requests in order (made at its first request)."""
        with self._lanes_lock:
            if url not in self._lanes:
                self._lanes[url] = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grpokit-lane")
            return self._lanes[url]

    def _group(self, url: str, answer: dict, n: int, sampling: SamplingSettings) -> list[Completion]:
        """The n completions of one prompt's answer, each checked; a ValueError names the server and the fault."""
        choices = answer["choices"]
        indices = [c.get("index") if isinstance(c, dict) else None for c in choices]
        if not all(_is_int(i) for i in indices) or sorted(indices) != list(range(n)):
            raise ValueError(
                f"inference server {url} answered {len(choices)} choices with indices {indices[:10]} for n={n}: "
                f"a completions answer has one choice per completion, indexed 0..{n - 1}"
            )
        try:
            return [self._completion(c, answer, sampling) for c in sorted(choices, key=lambda c: c["index"])]
        except ValueError as e:
            raise ValueError(f"inference server {url}: {e}") from None

    def _body(self, prompt_ids: list, n: int, sampling: SamplingSettings, index: int, vision=None) -> dict:
        """A completions request; `vision`: the prompt's image inputs (grpokit's server only, `_check_images`)."""
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
        if sampling.stop_token_ids:
            body["stop_token_ids"] = sampling.stop_token_ids
        if self.pin_weights:  # grpokit's server: weights of at most this step (dropped for other servers)
            body["max_weight_step"] = max(self.weight_step, 0)
        if vision:
            body["vision"] = to_base64(vision)
        return body

    def _completion(self, choice: dict, answer: dict, sampling: SamplingSettings) -> Completion:
        """One choice as a Completion, after checking what the orchestrator and the trainer rely on."""
        token_ids = choice.get("token_ids") or []
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs") or []
        where = f"choice {choice['index']}"
        if not isinstance(token_ids, list) or not all(_is_int(t) for t in token_ids):
            raise ValueError(f"{where}: token_ids must be a list of integers")
        if not isinstance(logprobs, list) or not all(_is_number(x) for x in logprobs):
            raise ValueError(f"{where}: logprobs.token_logprobs must be a list of numbers")
        if len(logprobs) != len(token_ids):
            raise ValueError(
                f"server answered {len(token_ids)} token ids but {len(logprobs)} "
                "logprobs: it must support logprobs and return_token_ids"
            )
        if len(token_ids) > sampling.max_tokens:
            raise ValueError(f"{where} has {len(token_ids)} tokens, more than max_tokens={sampling.max_tokens}")
        vocab = self.vocab_size
        if vocab is not None and (bad := [t for t in token_ids if not 0 <= t < vocab]):
            raise ValueError(f"{where}: token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
        if bad := [x for x in logprobs if math.isfinite(x) and x > LOGPROB_TOLERANCE]:
            raise ValueError(f"{where}: logprobs {bad[:5]} are above 0 (a logprob is log p <= 0)")
        step = answer.get("weight_step")
        if step is not None and not _is_int(step):
            raise ValueError(f"weight_step must be an integer or absent, got {step!r}")
        served = self.weight_step if step is None else step  # a local: concurrent requests (streams) answer apart
        self.server_weight_step = served
        reason = server_finish_reason(choice.get("finish_reason"))  # vLLM's "abort" is no natural stop
        return Completion(token_ids, [float(x) for x in logprobs], reason == "length", served, finish_reason=reason)

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

    def stream_completion(self, url: str, body: dict, interrupted: Callable[[], bool]):
        """POST a completions `body` as a streamed request (`stream: true`) and read its chunks until the
        answer ends or `interrupted(segment so far)` says so after a chunk, when the connection is closed
        (the server then aborts the request); a grpokit.inference.interrupting.Segment."""
        from grpokit.inference.interrupting import read_segment

        prompt = body["prompt"]
        n = body["n"] * (len(prompt) if prompt and isinstance(prompt[0], list) else 1)
        segment = self._call(
            url,
            "completions",
            {**body, "stream": True},
            read=lambda response: read_segment(response, interrupted, url, n),
        )
        step = self.segment_step(segment)
        segment.weight_step = self.weight_step if step is None else step
        return segment

    def segment_step(self, segment) -> int | None:
        """The weight step a streamed answer's chunks name (grpokit's `weight_step`); None if they do not."""
        return segment.weight_step

    def _call(self, url: str, endpoint: str, body: dict | None = None, read: Callable[..., T] | None = None) -> T:
        """POST `body` to `{url}/{endpoint}` (GET without a body); returns the raw answer, or what `read`
        makes of the open response.

        A server that is down, restarting, busy, drops the connection or cuts its answer short (connection
        errors, timeouts, http.client errors, 429 and 5xx answers) is retried max_retries times with
        exponential backoff (0.5 s, 1 s, 2 s, ... at most 30 s apart; longer where a Retry-After header
        asks, up to 60 s), then reported with an error naming it. Redirects are refused, never followed.
        """
        if self.run_name is not None and not endpoint.startswith("weights") and url not in self._runs_checked:
            self._check_run(url, body.get("max_weight_step") if body is not None else None)
        if body is not None and "vision" in body:
            self._check_images(url)  # another server would sample the ids without the images
        if body is not None and "max_weight_step" in body and url not in self._grpokit_servers:
            body = {k: v for k, v in body.items() if k != "max_weight_step"}  # grpokit's field: not for vLLM & co
        data = None if body is None else json.dumps(body).encode()
        for attempt in range(self.max_retries + 1):
            request = urllib.request.Request(
                f"{url.rstrip('/')}/{endpoint}",
                data=data,
                headers=self._headers,
                method="GET" if body is None else "POST",
            )
            delay = min(30.0, 0.5 * 2**attempt)
            try:
                with OPENER.open(request, timeout=self.timeout) as response:
                    return response.read() if read is None else read(response)
            except urllib.error.HTTPError as e:
                if 300 <= e.code < 400:
                    raise RemoteError(
                        f"{url}/{endpoint} answered {e.code}, a redirect to {e.headers.get('Location')!r}: "
                        "RemoteEngine follows no redirects (they would carry the request and its API key "
                        "elsewhere); set inference.init_args.base_url to the server's own address",
                        e.code,
                    ) from e
                if (e.code < 500 and e.code != 429) or attempt == self.max_retries:
                    raise RemoteError(f"{url}/{endpoint} answered {e.code}: {e.read()[:500]!r}", e.code) from e
                delay = max(delay, retry_after(e.headers.get("Retry-After")))
                cause = f"answered {e.code}"
            except (urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException) as e:
                cause = f"{type(e).__name__}: {getattr(e, 'reason', None) or e}"
                if attempt == self.max_retries:
                    raise ConnectionError(
                        f"inference server {url} failed {self.max_retries + 1} tries "
                        f"({type(e).__name__}: {e}): is `grpokit infer` (or vLLM) serving there? "
                        "Retries and the per-request limit are inference.init_args.max_retries "
                        f"({self.max_retries}) and inference.init_args.timeout ({self.timeout:g}s)."
                    ) from e
            log.warning(
                "request to %s/%s failed (%s; try %d of %d), retrying in %.1fs",
                url,
                endpoint,
                cause,
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


def retry_after(value: str | None) -> float:
    """Seconds a Retry-After header asks to wait (a number or an HTTP date), 0 when absent or unreadable,
    at most MAX_RETRY_AFTER."""
    if not value:
        return 0.0
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return 0.0
    return min(MAX_RETRY_AFTER, max(0.0, seconds)) if math.isfinite(seconds) else 0.0


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)
