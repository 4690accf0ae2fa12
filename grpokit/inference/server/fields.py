"""What grpokit's request models (grpokit.inference.server.requests) are built from: the validation
context, the checks a field declares (a range, a refusal, one message for any error), the base that reads
a JSON object, and the groups of fields every endpoint shares: the sampling fields (SamplingFields, read
into the SamplingRequest the engine thread uses) and `stream`.

How a model reads a body:
- JSON's types, strictly: a boolean is not an integer, "1" is not a number, an integer is a number.
- null is the same as an absent field: its default.
- Unknown fields are ignored, as vLLM does; fields the server cannot honour are declared and refused.
- Fields are checked in the order they are declared and the first error is answered
  (grpokit.inference.server.errors). pydantic lists a model's fields base by base from its last base,
  so `ChatCompletionRequest(StreamFields, SamplingFields, ChatFields)` checks the chat fields, then the
  sampling ones, then `stream`; a validator reads the fields before its own in `info.data`.
- The server's limits, the model it serves and its engine come in the validation context
  (RequestContext), so one set of models serves every server."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    WrapValidator,
    field_validator,
    model_validator,
)
from typing_extensions import Self

from grpokit.inference import MAX_REPETITION_PENALTY, MIN_TEMPERATURE, repetition_penalty_ok, temperature_ok
from grpokit.inference.server.errors import refused, unmet, validate
from grpokit.inference.server.limits import ServerLimits


@dataclass(frozen=True)
class RequestContext:
    """What the request models check a body against besides the body: the server's limits, the model it
    serves (None: any) and its engine (whether it reports top logprobs)."""

    limits: ServerLimits
    model_name: str | None = None
    engine: Any = None


def fast_path(engine: Any) -> str:
    return " on its fast CUDA path" if getattr(engine, "fast", False) else ""


def unknown_model(model: str, served: str) -> str:
    return f"the model `{model}` does not exist; this server serves `{served}`"


def must(requirement: str, ok: Callable[[Any], bool]) -> AfterValidator:
    """A range for a field: a value outside it is refused as "<field> must be <requirement>, got <value>"."""

    def check(value: Any) -> Any:
        if not ok(value):
            raise unmet(requirement)
        return value

    return AfterValidator(check)


def otherwise(message: str) -> WrapValidator:
    """One message for any error in a value of this type, whether of its type or of a constraint."""

    def check(value: Any, handler: Callable[[Any], Any]) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise refused(message) from None

    return WrapValidator(check)


def only(*defaults: Any, refusal: str = "{} is not supported") -> AfterValidator:
    """A field this server cannot honour: a value but these (its defaults; or null, as for every field)
    would change the result, so it is refused. No `defaults`: any value but null is."""

    def check(value: Any, info: ValidationInfo) -> Any:
        if value not in defaults:
            raise refused(refusal.format(info.field_name))
        return value

    return AfterValidator(check)


def within_top_logprobs(sampled_first: bool = False) -> AfterValidator:
    """How many top logprobs a request asks for: within server.limits.max_top_logprobs and what the engine
    can report. `sampled_first`: the first of the k shown is the sampled token (generate, as vLLM), so
    only k >= 2 needs the engine's top ones."""

    def check(k: int, info: ValidationInfo) -> int:
        limit, engine = info.context.limits.max_top_logprobs, info.context.engine
        if not 0 <= k <= limit:
            raise unmet(f"in [0, {limit}] (server.limits.max_top_logprobs)")
        if k and (k >= 2 or not sampled_first) and not getattr(engine, "reports_top_logprobs", True):
            raise refused(
                f"{info.field_name}={k}: this server's engine ({type(engine).__name__}{fast_path(engine)}) reports "
                f"only the sampled token's logprob; ask for {1 if sampled_first else 0}"
            )
        return k

    return AfterValidator(check)


Number = Annotated[float, Field(allow_inf_nan=False)]  # an integer too, never a boolean
AtLeastOne = Annotated[int, must(">= 1", lambda v: v >= 1)]
Text = Annotated[str, Field(min_length=1)]
# fail_fast on every array: its first bad item is the error; without it pydantic would collect one error
# per bad item (seconds and gigabytes for a body of a million) and the answer names only the first.
TokenIds = Annotated[list[int], Field(min_length=1, fail_fast=True)]


class Fields(BaseModel):
    """Fields read from a JSON object: JSON's types strictly, null as absent, unknown fields ignored.
    An array or object default is a default_factory: pydantic deep-copies a [] or {} default for each
    request (~1 us each)."""

    model_config = ConfigDict(strict=True, extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _null_is_absent(cls, data: Any) -> Any:
        if isinstance(data, dict) and None in data.values():
            return {k: v for k, v in data.items() if v is not None}
        return data

    @classmethod
    def parse(cls, body: Any, context: RequestContext) -> Self:
        """`body` read as this model, or the RequestError of its first error."""
        return validate(cls, body, context)


class Body(Fields):
    """A request's top level: `model`, when given, must be the one the server serves (else a 404)."""

    model: str | None = None

    @field_validator("model")
    @classmethod
    def _served(cls, model: str, info: ValidationInfo) -> str:
        served = info.context.model_name
        if served is not None and model != served:
            raise refused(unknown_model(model, served), status=404)
        return model


@dataclass
class SamplingRequest:
    """What the engine thread reads of a checked request's sampling fields."""

    n: int
    max_tokens: int | None
    temperature: float
    top_p: float
    stop: list[str]
    seed: int
    logprobs: bool
    return_token_ids: bool
    min_tokens: int = 0
    repetition_penalty: float = 1.0
    top_logprobs: int = 0
    stop_token_ids: list[int] = dataclass_field(default_factory=list)
    priority: int = 0  # vLLM's field: lower is served first (the engine queue's order, EngineWorker.submit)
    max_weight_step: int | None = None  # grpokit's: sample with the newest weights up to this step

    @classmethod
    def parse(
        cls, body: dict, max_tokens: int | None, logprobs: bool, limits: ServerLimits, top_logprobs: int = 0
    ) -> SamplingRequest:
        """The sampling fields of `body`; `max_tokens`, `logprobs` and `top_logprobs` as the endpoint has
        read them."""
        fields = SamplingFields.parse({**body, "max_tokens": max_tokens}, RequestContext(limits))
        return fields.sampling(logprobs, top_logprobs)


class SamplingFields(Fields):
    """The sampling fields every endpoint shares (/inference/v1/generate: in its `sampling_params`)."""

    max_tokens: AtLeastOne | None = None
    # Fields whose value, but for their default, would change the result in a way this server cannot
    # honour: refused.
    echo: Annotated[Any, only(False)] = None
    best_of: Annotated[Any, only(1)] = None
    suffix: Annotated[Any, only("")] = None
    logit_bias: Annotated[Any, only({})] = None
    presence_penalty: Annotated[Any, only(0)] = None
    frequency_penalty: Annotated[Any, only(0)] = None
    top_k: Annotated[Any, only(-1, 0)] = None
    min_p: Annotated[Any, only(0)] = None
    tools: Annotated[Any, only([])] = None
    response_format: Annotated[Any, only({"type": "text"})] = None
    seed: Annotated[int, must("in [0, 2**63)", lambda v: 0 <= v < 2**63)] = Field(
        default_factory=lambda: secrets.randbits(63)
    )
    n: int = 1  # at most server.limits.max_n
    temperature: Annotated[Number, must(f"0 or >= {MIN_TEMPERATURE:g}", temperature_ok)] = 1.0
    top_p: Annotated[Number, must("in (0, 1]", lambda v: 0 < v <= 1)] = 1.0
    stop: Annotated[list[Text], Field(fail_fast=True)] = Field(default_factory=list)
    return_token_ids: bool = False
    min_tokens: int = 0  # at most max_tokens
    repetition_penalty: Annotated[Number, must(f"in (0, {MAX_REPETITION_PENALTY:g}]", repetition_penalty_ok)] = 1.0
    # vLLM's: token ids that end a completion besides EOS, each once, in order (the app checks them
    # against the vocabulary)
    stop_token_ids: Annotated[
        list[Annotated[int, Field(ge=0)]],
        Field(fail_fast=True),
        otherwise("stop_token_ids must be an array of token ids (integers >= 0)"),
        AfterValidator(lambda ids: list(dict.fromkeys(ids))),
    ] = Field(default_factory=list)
    priority: Annotated[int, must("a 32-bit integer", lambda v: -(2**31) <= v < 2**31)] = 0  # vLLM's
    # grpokit's: the newest published weights up to this step, not newer (the orchestrator's deterministic
    # schedule, data.deterministic); a server already holding newer ones answers 409
    max_weight_step: Annotated[int, must("a step number (>= 0)", lambda v: 0 <= v < 2**63)] | None = None

    @field_validator("n")
    @classmethod
    def _within_max_n(cls, n: int, info: ValidationInfo) -> int:
        limit = info.context.limits.max_n
        if not 1 <= n <= limit:
            raise unmet(f">= 1 and <= {limit} (server.limits.max_n)")
        return n

    @field_validator("stop", mode="wrap")
    @classmethod
    def _within_max_stop(cls, stop: Any, handler: Callable[[Any], list[str]], info: ValidationInfo) -> list[str]:
        """A string or an array of them, non-empty, at most server.limits.max_stop of them (counted first:
        a long array is refused unread) and max_stop_chars characters each (every decode step searches
        the text for each)."""
        limits = info.context.limits
        stop = [stop] if isinstance(stop, str) else stop
        if isinstance(stop, list) and len(stop) > limits.max_stop:
            raise refused(f"{len(stop)} stop strings, over the limit of {limits.max_stop} (server.limits.max_stop)")
        try:
            stop = handler(stop)
        except ValidationError:
            raise refused("stop must be a non-empty string or an array of them") from None
        longest = max(map(len, stop), default=0)
        if longest > limits.max_stop_chars:
            raise refused(
                f"a stop string of {longest} characters, over the limit of {limits.max_stop_chars} "
                "(server.limits.max_stop_chars)"
            )
        return stop

    @field_validator("min_tokens")
    @classmethod
    def _within_max_tokens(cls, min_tokens: int, info: ValidationInfo) -> int:
        max_tokens = info.data.get("max_tokens")
        if min_tokens < 0 or (max_tokens is not None and min_tokens > max_tokens):
            raise unmet(f"in [0, max_tokens={max_tokens}]")
        return min_tokens

    def sampling(self, logprobs: bool, top_logprobs: int = 0) -> SamplingRequest:
        """These fields for the engine thread, with the endpoint's own reading of logprobs."""
        return SamplingRequest(
            n=self.n,
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            stop=self.stop,
            seed=self.seed,
            logprobs=logprobs,
            return_token_ids=self.return_token_ids,
            min_tokens=self.min_tokens,
            repetition_penalty=self.repetition_penalty,
            top_logprobs=top_logprobs,
            stop_token_ids=self.stop_token_ids,
            priority=self.priority,
            max_weight_step=self.max_weight_step,
        )


class StreamOptions(Fields):
    include_usage: bool = False


class StreamFields(Fields):
    """`stream: true` for server-sent events and, only then read, its `stream_options`."""

    stream: bool = False
    stream_options: StreamOptions | None = None

    @field_validator("stream_options", mode="wrap")
    @classmethod
    def _read_when_streaming(cls, options: Any, handler: Callable[[Any], Any], info: ValidationInfo) -> Any:
        return handler(options) if info.data.get("stream") else None

    @property
    def usage(self) -> bool | None:
        """None for a plain answer; else whether a streamed answer ends with a usage chunk."""
        if not self.stream:
            return None
        return self.stream_options is not None and self.stream_options.include_usage
