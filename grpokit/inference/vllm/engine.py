"""VLLMEngine: RemoteEngine for vLLM's OpenAI server, hot-loading each step's LoRA adapter.

`grpokit infer` starts the server when `serve` is set (grpokit.inference.vllm.server), and so does
`grpokit fit`, which then samples from it (grpokit.inference.vllm.launch); otherwise start it yourself,
with LoRA and runtime adapter loading on:

    VLLM_ALLOW_RUNTIME_LORA_UPDATING=True python -m vllm.entrypoints.openai.api_server \\
        --model BASE --served-model-name base --enable-lora --max-lora-rank 16 --port 8000

`load_weights(update)` POSTs `/v1/load_lora_adapter` with the update's folder in the filesystem
broadcast (`broadcasts/step_N/`, a peft adapter; pinned while loaded, `pin_adapter`) under the name
`step_N`; completions sent after it request `model: step_N`. The previous adapter is unloaded once
no request sent with it is still running. Each request keeps the adapter it was sent with (vLLM 0.32, measured by
bench/vllm_inflight.py), and its answer names that adapter's step; so a stream (a request per group)
aborts the requests in flight at an update and resubmits their continuations under the new adapter
(grpokit.inference.interrupting), or with `on_update: finish` lets them finish with the old one.
vLLM answers no `weight_step`, so the step of a completion is read from the adapter name it echoes in
`model` (the base model name means step 0: a fresh LoRA adapter is zero, so the base weights are the
step-0 policy). `grpokit eval` loads the evaluated step the same way (`pushes_weights`), and samples
`--base` under the base name.

Full-weights updates reach vLLM only through `broadcast: VLLMNCCLBroadcast`, which loads them into
vLLM's worker (grpokit.inference.vllm.worker); the engine then serves the base name with that step and
resets the prefix cache. Over the filesystem broadcast they are refused (vLLM hot-loads only LoRA
adapters from disk). Departures from the builtin engine: vLLM's logprobs are of the raw model
distribution unless the server runs with `--logprobs-mode processed_logprobs`, which matters for
temperatures other than 1 and whenever `min_tokens` or `repetition_penalty` is set (the raw logprobs
are then not those of the distribution the tokens were drawn from). vLLM's processed logprobs are also
after top-p truncation; the builtin engine's are before it.

QeRL noise (model.noise_scheduler) is refused at start: `/v1/load_lora_adapter` loads adapter weights
only (vLLM 0.32's LoRA loader rejects modules outside the target modules and takes at most one full
module, a classification head), so the noisy RMSNorm weights cannot ride in the adapter. vLLM 0.32's
weight-transfer endpoints (`/init_weight_transfer_engine`, `/update_weights`) could set them by name;
that is not wired yet.

Prompts with images go to vLLM's token-in route `/inference/v1/generate` (served with --enable-scale-out)
as their ids before expansion plus the pictures; vLLM's prompt ids are checked against grpokit's on every
request (grpokit.inference.vllm.images). A streamed image request is sent whole, so an update never cuts
it (it finishes on the adapter it was sent with), as on `grpokit infer`. A later turn that brought pictures
(`respond`'s, a tool's) is sent the same way: the whole conversation's ids before expansion and every
picture so far, from the conversation's ImageSource, grown turn by turn (grpokit.vision.inputs.with_turn).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections import Counter
from pathlib import Path

from grpokit.common.weight_probe import check_probe
from grpokit.inference import SamplingSettings
from grpokit.inference.interrupting import Segment
from grpokit.inference.remote import RemoteEngine, RemoteError
from grpokit.inference.vllm.images import GENERATE, completions_answer, generate_requests, route_error
from grpokit.inference.vllm.server import VLLMServe
from grpokit.types import WeightUpdate

log = logging.getLogger(__name__)
PIN_GRACE_S = 60.0  # seconds an unloaded adapter's pinned files stay on disk (VLLMEngine._sweep_pins)


class VLLMEngine(RemoteEngine):
    """Client of vLLM OpenAI servers that hot-loads the trainer's LoRA adapter of each step."""

    applies_norm_weights = False  # LoRA hot reload carries adapter weights only
    checks_probe = True  # its tensors cannot be shown: each loaded step is checked by the weight probe
    pushes_weights = True  # load_weights puts the step's adapter into the servers: `grpokit eval` loads any step
    takes_vision = True  # generate(vision=) and the streams send a group's pictures (grpokit.inference.vllm.images)
    later_turn_images = True  # a later turn's request: the conversation's grown ImageSource (vllm/images.py)

    def __init__(
        self,
        base_url: list[str] | str = "http://127.0.0.1:8000/v1",
        model_name: str = "base",
        api_key_var: str | None = None,
        timeout: float = 600.0,
        max_retries: int = 5,
        max_concurrency: int = 8,
        serve: VLLMServe | None = None,
    ) -> None:
        """
        Args:
            base_url: one vLLM server URL or a list of them (ending in /v1); each loads every adapter,
                so all must see the run's broadcast folder.
            model_name: the server's served model name (`--served-model-name`), used until an adapter is loaded.
            api_key_var: name of the environment variable holding the API key (never the key itself).
            timeout: seconds per request.
            max_retries: retries with exponential backoff on connection errors and 5xx answers.
            max_concurrency: requests in flight at once.
            serve: how `grpokit infer` (or `grpokit fit`, which then samples from it instead of
                base_url) starts the vLLM server on server.host:server.port; null: the server is
                started some other way.
        """
        super().__init__(base_url, model_name, api_key_var, timeout, max_retries, max_concurrency)
        self.continuation_priority = None  # vLLM refuses `priority` without --scheduling-policy priority
        self.base_model_name, self.serve = model_name, serve
        self.adapter: str | None = None
        self.base_step = 0  # the step of the weights served under the base name (full updates move it)
        self._lock = threading.Lock()  # requests are sent from worker threads while weights load
        self._users: Counter[str] = Counter()  # adapter name -> requests sent with it, not yet answered
        self._retired: set[str] = set()  # replaced adapters still in use: unloaded by their last answer
        self._pins: dict[str, str] = {}  # adapter name -> the folder of its files vLLM loads (pin_adapter)
        self._unpinned: list[tuple[float, str]] = []  # (unload time, folder) of unloaded adapters, kept a while
        self._probe_before: list[float] | None = None  # the trainer's probe of the step loaded before
        self.probe_error: float | None = None  # the last loaded step's (grpokit.common.weight_probe)
        self._unprobed: set[str] = set()  # servers that answer no prompt_logprobs (named once)
        self._placeholders: set[int] | None = None  # the model's image placeholder ids, read at the first image

    def load_weights(self, update: WeightUpdate) -> None:
        if update.lora_config is None and update.in_engine:  # VLLMNCCLBroadcast loaded them into the worker
            self._serve_base(update.step)
            return
        if update.lora_config is None:
            raise ValueError(
                "VLLMEngine hot-loads LoRA adapters only from the filesystem broadcast, and this update holds full "
                "weights: train with model.lora set, or send full weights into vLLM's worker with "
                "`broadcast: VLLMNCCLBroadcast`"
            )
        if update.path is None:
            raise ValueError(
                "VLLMEngine loads adapters from disk: use `broadcast: FilesystemBroadcast` (the update has no folder)"
            )
        if update.lora_config.get("modules_to_save"):
            raise ValueError(
                f"the adapter of step {update.step} trains {update.lora_config['modules_to_save']} in full "
                "(model.vision.train), which vLLM's LoRA cannot load: train them with full weights "
                "(model.lora: null, broadcast VLLMNCCLBroadcast), or sample with BuiltinEngine"
            )
        name = f"step_{update.step}"
        self._sweep_pins()
        path = pin_adapter(update.path, name)
        with self._lock:  # the pin bookkeeping is shared with the request threads' unloads (_release)
            self._pins[name] = path
            self._unpinned = [(t, p) for t, p in self._unpinned if p != path]  # a step published again: keep it
        for url in self.base_urls:
            self._load_adapter(url, name, path)
        if update.probe is not None:
            self._check_probe(name, update)
        with self._lock:
            previous, self.adapter, self.model_name, self.weight_step = self.adapter, name, name, update.step
            self._retired.discard(name)
            if previous is not None and previous != name and self._users[previous]:
                self._retired.add(previous)  # its last running request unloads it (_post)
                log.info("adapter %s stays loaded for its %d running requests", previous, self._users[previous])
                previous = None
        if previous is not None and previous != name:
            self._unload_everywhere(previous)
        log.info("vLLM serves adapter %s from %s", name, update.path)

    def _check_probe(self, name: str, update: WeightUpdate) -> None:
        """Each server's logprobs of the weight probe under adapter `name` (prompt_logprobs, vLLM's field)
        against the trainer's: WeightsNotLoadedError, naming the step and server, when a server still
        samples with the step before (grpokit.common.weight_probe). A server that answers no
        prompt_logprobs (not vLLM) is named once in a warning and not probed."""
        ids, expected = update.probe["token_ids"], update.probe["logprobs"]
        body = {"model": name, "prompt": ids, "n": 1, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}
        errors = []
        for url in self.base_urls:
            answer = json.loads(self._call(url, "completions", body))
            try:
                entries = answer["choices"][0]["prompt_logprobs"][1:]
                got = [entry[str(token)]["logprob"] for entry, token in zip(entries, ids[1:])]
            except (KeyError, IndexError, TypeError) as e:
                if url not in self._unprobed:
                    log.warning("%s answered no prompt_logprobs (%r): the weight probe does not check it", url, e)
                    self._unprobed.add(url)
                continue
            errors.append(check_probe(update.step, got, expected, self._probe_before, f"vLLM at {url}"))
        self._probe_before = expected
        if errors:
            self.probe_error = max(errors)
            log.info("vLLM's weight probe of step %d: %.2e from the trainer's (mean |logprob difference|)",
                     update.step, self.probe_error)  # fmt: skip

    def _serve_base(self, step: int) -> None:
        """The servers' base model now holds the weights of `step`: serve it, drop the last adapter and the
        prefix cache (its KV entries were computed with the old weights)."""
        previous, self.adapter, self.model_name, self.base_step, self.weight_step = (
            self.adapter,
            None,
            self.base_model_name,
            step,
            step,
        )
        if previous is not None:
            self._unload_everywhere(previous)
        for url in self.base_urls:
            self._call(url.removesuffix("/v1"), "reset_prefix_cache", {})
        log.info("vLLM serves full weights of step %d", step)

    def _load_adapter(self, url: str, name: str, path: str) -> None:
        # load_inplace: a server that outlived an earlier run may hold another adapter under this name
        body = {"lora_name": name, "lora_path": path, "load_inplace": True}
        try:
            self._call(url, "load_lora_adapter", body)
        except RemoteError as e:
            if e.code == 404:
                raise RuntimeError(
                    f"{url} has no /load_lora_adapter: start vLLM with "
                    "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora"
                ) from e
            raise

    def _unload_everywhere(self, name: str) -> None:
        for url in self.base_urls:
            try:
                self._call(url, "unload_lora_adapter", {"lora_name": name})
            except RemoteError as e:  # already gone: nothing to free
                log.warning("could not unload adapter %s from %s: %s", name, url, e)
        with self._lock:
            if (pinned := self._pins.pop(name, None)) is not None:
                self._unpinned.append((time.monotonic(), pinned))

    def _sweep_pins(self) -> None:
        """Delete the pinned folders of adapters unloaded PIN_GRACE_S ago. Not at once: a request closed
        by its client is aborted in vLLM's engine core a little later than the unload, and until then
        the engine core may schedule it and load its adapter again (vLLM 0.32's CPU build died so)."""
        now = time.monotonic()
        with self._lock:
            due = [p for t, p in self._unpinned if now - t >= PIN_GRACE_S]
            self._unpinned = [(t, p) for t, p in self._unpinned if now - t < PIN_GRACE_S]
        for path in due:
            shutil.rmtree(path, ignore_errors=True)

    def _check_images(self, url: str) -> None:
        """Once per server (RemoteEngine.samples_images asks every server): whether it serves vLLM's token-in
        route, where prompts with images go. An empty request to /inference/v1/generate, which a server with
        the route refuses as invalid (400/422) and one without it answers 403 (no --enable-scale-out) or 404."""
        if url in self._image_servers:
            return
        try:
            self._call(url.removesuffix("/v1"), GENERATE, {})
        except RemoteError as e:
            if (why := route_error(url, e.code, str(e))) is not None:
                raise ValueError(why) from None
        self._image_servers.add(url)

    def _body(self, prompt_ids: list[int], n: int, sampling: SamplingSettings, index: int, vision=None) -> dict:
        """RemoteEngine's request body, its adapter counted as in use until the answer (`_post`); a prompt
        with images keeps its VisionInputs under GENERATE, which sends it to the token-in route."""
        with self._lock:
            body = super()._body(prompt_ids, n, sampling, index)
            self._users[body["model"]] += 1
        if vision:
            body[GENERATE] = vision
        return body

    def _post(self, url_body: tuple[str, dict]) -> dict:
        url, body = url_body
        name = body["model"]
        try:
            answer = self._post_images(url, body) if GENERATE in body else super()._post(url_body)
        finally:
            self._release(name)
        if "weight_step" not in answer:  # vLLM echoes the adapter name in `model`
            answer["weight_step"] = self._step_named(answer.get("model", name))
        return answer

    def stream_completion(self, url: str, body: dict, interrupted):
        """RemoteEngine's streamed request, its adapter counted as in use until it ends, and its step
        read from the adapter name vLLM echoes."""
        name = body["model"]
        try:
            if GENERATE in body:  # sent whole: an update does not cut it
                segment = Segment()
                segment.add(self._post_images(url, body), url)
                segment.weight_step = self.segment_step(segment)
            else:
                segment = super().stream_completion(url, body, interrupted)
        finally:
            self._release(name)
        if segment.model is None:
            segment.weight_step = self._step_named(name)
        return segment

    def _post_images(self, url: str, body: dict) -> dict:
        """A prompt with images through vLLM's token-in route (grpokit.inference.vllm.images), answered as
        a completions answer whose prompt ids were checked to be grpokit's."""
        self._check_images(url)
        if self._placeholders is None:
            from transformers import AutoConfig

            from grpokit.common.models import resolve_model
            from grpokit.vision.logprobs import image_token_ids

            self._placeholders = image_token_ids(AutoConfig.from_pretrained(resolve_model(self._model)))
        requests = generate_requests(body, body[GENERATE], self._placeholders)
        root = url.removesuffix("/v1")
        answers = [json.loads(self._call(root, GENERATE, request)) for request, _ in requests]
        return completions_answer(url, answers, [ids for _, ids in requests], self._placeholders)

    def segment_step(self, segment) -> int | None:
        """vLLM streams no weight_step: the step of the adapter name its chunks echo in `model`."""
        return None if segment.model is None else self._step_named(segment.model)

    def _release(self, name: str) -> None:
        """A request sent with adapter `name` has ended: unload it if it was replaced and this was its last."""
        with self._lock:
            self._users[name] -= 1
            last = not self._users[name] and name in self._retired
            if last:
                del self._users[name]
                self._retired.discard(name)
        if last:
            self._unload_everywhere(name)

    def _step_named(self, served: object) -> int:
        """The weight step of a served model name: step_N is N, the base name the base weights' step."""
        if isinstance(served, str) and served.startswith("step_") and served[5:].isdigit():
            return int(served[5:])
        return self.base_step


def pin_adapter(path: str, name: str) -> str:
    """A folder holding the files of the adapter at `path` for as long as vLLM may load them: hard links
    (copies where the filesystem has none) in `pinned/<name>` beside the broadcast's step folders. vLLM
    reads an adapter's files again whenever it has evicted it from its cache (more adapters in use than
    --max-loras, as when requests finish on older steps), and the broadcast's retention deletes a step
    once the orchestrator has acknowledged newer ones: vLLM's engine core dies on the missing file. The
    links keep the files; the engine removes the folder a while after it unloads the adapter."""
    source = Path(path)
    pinned = source.parent / "pinned" / name
    tmp = pinned.with_name(f".{name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for file in source.iterdir():
        if file.is_file():
            try:
                os.link(file, tmp / file.name)
            except OSError:  # another device, or no hard links: a copy
                shutil.copy2(file, tmp / file.name)
    shutil.rmtree(pinned, ignore_errors=True)
    os.replace(tmp, pinned)
    return str(pinned)
