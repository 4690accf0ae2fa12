"""The engine thread's part of a request to grpokit's server: newer weights from the broadcast first,
the prompt rendered and checked against the context once tokenised, then `generate` with the request's
ServingOptions (top logprobs, the decode steps for a streamed answer, cancellation when its client has
gone). Everything here runs on the one engine thread (grpokit.inference.server.worker)."""

from __future__ import annotations

import logging

from grpokit.broadcast import WeightBroadcast
from grpokit.common.loaded_weights import check_loaded, update_source
from grpokit.inference import Completion, InferenceEngine, NewTokens, SamplingSettings, ServingOptions
from grpokit.inference.server.answers import Answers
from grpokit.inference.server.images import ServedImages
from grpokit.inference.server.requests import PromptBudget, RequestError, SamplingRequest
from grpokit.inference.server.stream import AnswerStream
from grpokit.inference.server.worker import EngineCall
from grpokit.vision.inputs import VisionInputs

log = logging.getLogger(__name__)


class RequestSampler:
    """Samples a checked request with the engine, on the engine thread."""

    def __init__(
        self,
        engine: InferenceEngine,
        tokenizer,
        broadcast: WeightBroadcast | None,
        max_model_len: int | None,
        budget: PromptBudget,
        answers: Answers,
        images: ServedImages | None = None,
    ) -> None:
        self.engine, self.tokenizer, self.broadcast = engine, tokenizer, broadcast
        self.max_model_len, self.budget, self.answers = max_model_len, budget, answers
        self.images = images  # prompts with images (grpokit.inference.server.images)
        self._weights_error: str | None = None  # the last failed read of the broadcast, logged once

    def render(self, messages: list[dict], template_kwargs: dict) -> list[int]:
        try:
            ids = list(
                self.tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=True, return_dict=False, **template_kwargs
                )
            )
        except Exception as e:  # jinja raises for messages its template rejects (roles out of order, ...)
            raise RequestError(
                f"the chat template rejected the messages: {type(e).__name__}: {e}", "messages"
            ) from None
        if not ids:
            raise RequestError("the chat template rendered the messages to no tokens", "messages")
        return ids

    def load_newer_weights(self, strict: bool = False, upto: int | None = None) -> None:
        """Load the newest weights the broadcast has published, if newer than the engine's; with `upto`
        (a request's `max_weight_step`: the orchestrator's deterministic schedule), the newest up to that
        step, and a RequestError (409) if the engine already holds a newer one.

        A step that cannot be read (a truncated or corrupt file: the broadcast's error names it) leaves the
        engine's weights as they are: logged (once per error), and the engine serves on with the step it
        holds, which every answer's weight_step reports; `strict` raises it instead (GET /v1/weights,
        whose promise is the newest step). An engine that fails while loading, or does not hold the update
        afterwards (grpokit.common.loaded_weights), is in no known state: that always raises."""
        if self.broadcast is None:
            return
        held, source = self.engine.weight_step, type(self.broadcast).__name__
        if upto is not None and held > upto:
            raise RequestError(
                f"max_weight_step is {upto}, but this server already holds the weights of step {held}: another "
                "client moved it ahead, or the trainer restarted from an earlier checkpoint. Restart `grpokit "
                "infer`, or set data.deterministic: false in the orchestrator's recipe",
                "max_weight_step",
                status=409,
            )
        try:
            update = self.broadcast.poll(held, upto=upto)
        except Exception as e:
            error = f"reading the newest weights from {source} failed: {type(e).__name__}: {e}"
            if strict:
                raise RuntimeError(f"{error} (the engine holds step {held})") from e
            if error != self._weights_error:
                log.error("%s; serving on with the weights of step %d", error, held)
            self._weights_error = error
            return
        self._weights_error = None
        if update is None:
            return
        log.info("loading weights of step %d (was %d)", update.step, held)
        try:
            self.engine.load_weights(update)
            check_loaded(self.engine, update, update_source(self.broadcast, update))
        except Exception as e:
            raise RuntimeError(
                f"loading the newest weights from {source} (the engine holds step {held}) failed: "
                f"{type(e).__name__}: {e}"
            ) from e

    def stream_of(self, kind: type[AnswerStream], call: EngineCall, prompts, params, usage) -> AnswerStream | None:
        """The chunks of a streamed answer (None for a plain one), written to the request's `call.emit`."""
        if call.emit is None:
            return None
        return kind(
            self.answers,
            call.emit,
            prompts,
            params.n,
            params.stop,
            params.logprobs,
            params.return_token_ids,
            usage,
            params.stop_token_ids,
        )

    def sample(
        self,
        prompts: list[list[int]],
        params: SamplingRequest,
        param: str,
        call: EngineCall,
        stream: AnswerStream | None = None,
        vision: VisionInputs | None = None,
    ) -> list[list[Completion]]:
        """Load newer broadcast weights, check the prompts and max_tokens against the context, then sample
        n completions per prompt (`stream` follows the decode steps; `call.cancelled` stops them). `param`
        names the prompt's field in errors. `vision`: every prompt's image inputs (ServedImages.generate)."""
        self.load_newer_weights(upto=params.max_weight_step)
        sampling = self.settings(prompts, params, param)
        options = ServingOptions(params.top_logprobs, stream.on_tokens if stream else None, call.cancelled)
        if stream is not None:
            stream.start(self.engine.weight_step)
        if vision is not None:
            groups = self.images.generate(prompts, vision, params.n, sampling, options)
        else:
            groups = generate_with(self.engine, prompts, params.n, sampling, options)
        if call.cancelled.is_set():
            raise RequestError("nobody waits for this answer any more", status=499)
        return groups

    def settings(self, prompts: list[list[int]], params: SamplingRequest, param: str) -> SamplingSettings:
        """The request's SamplingSettings, once its tokenised prompts and max_tokens fit the context."""
        for p in prompts:
            self.budget.check_tokens(len(p), param)
        room = None if self.max_model_len is None else self.max_model_len - max(map(len, prompts))
        max_tokens = params.max_tokens or max(room or SamplingSettings.max_tokens, 1)  # chat: the rest of the context
        if room is not None and max_tokens > room:
            raise RequestError(
                f"this model's context is {self.max_model_len} tokens: {self.max_model_len - room} "
                f"prompt tokens leave room for {room}, not max_tokens={max_tokens}",
                "max_tokens",
            )
        if params.min_tokens > max_tokens:
            raise RequestError(f"min_tokens ({params.min_tokens}) exceeds max_tokens ({max_tokens})", "min_tokens")
        return SamplingSettings(
            params.temperature,
            params.top_p,
            max_tokens,
            params.stop,
            params.seed,
            params.min_tokens,
            params.repetition_penalty,
            params.stop_token_ids,
        )


def generate_with(
    engine: InferenceEngine, prompts: list[list[int]], n: int, sampling: SamplingSettings, options: ServingOptions
) -> list[list[Completion]]:
    """engine.generate with a request's options; an engine without `takes_serving_options` is called
    plainly and its completions handed to `options.on_tokens` whole at the end (no cancellation)."""
    if engine.takes_serving_options:
        return engine.generate(prompts, n, sampling, options=options)
    groups = engine.generate(prompts, n, sampling)
    if options.on_tokens is not None:
        options.on_tokens(
            [
                NewTokens(i * n + j, c.token_ids, c.logprobs)
                for i, group in enumerate(groups)
                for j, c in enumerate(group)
            ]
        )
    return groups
