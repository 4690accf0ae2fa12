"""The bodies of grpokit's OpenAI API requests (grpokit.inference.server.http) as pydantic models, one per
endpoint (CompletionRequest, ChatCompletionRequest, GenerateRequest), each its own fields followed by the
ones the endpoints share (grpokit.inference.server.fields: how the models read JSON, and in which order);
and what the engine thread checks of a request before sampling (PromptBudget, check_rows). Anything the
server cannot honour is refused (400, naming the field and the fix: grpokit.inference.server.errors),
never silently ignored; unknown fields are ignored, as vLLM does."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    Field,
    ValidationError,
    ValidationInfo,
    WrapValidator,
    field_validator,
)
from typing_extensions import NotRequired, TypedDict

from grpokit.inference.server.errors import RequestError, refused
from grpokit.inference.server.fields import (
    AtLeastOne,
    Body,
    Fields,
    RequestContext,
    SamplingFields,
    SamplingRequest,
    StreamFields,
    Text,
    TokenIds,
    only,
    otherwise,
    within_top_logprobs,
)
from grpokit.inference.server.limits import ServerLimits
from grpokit.vision.images import ImageError
from grpokit.vision.messages import image_source, is_image_part

IMAGE_PART = '{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}'
DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions
KWARGS = "chat_template_kwargs"
# apply_chat_template's own parameters: the server sets them (or they change what it returns), so a
# request's chat_template_kwargs may not.
RESERVED_TEMPLATE_KWARGS = {
    "conversation",
    "tokenize",
    "return_dict",
    "add_generation_prompt",
    "return_tensors",
    "padding",
    "truncation",
    "max_length",
    "tokenizer_kwargs",
    "return_assistant_tokens_mask",
}


def parse_json(body: bytes) -> Any:
    """The request body as JSON; a 400 (never a 500) for bytes that are not JSON or nest too deeply."""
    try:
        return json.loads(body or b"null")
    except RecursionError:
        raise RequestError("request body nests JSON arrays or objects too deeply") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise RequestError(f"request body is not valid JSON: {e}") from None


def parse_stop(body: dict, limits: ServerLimits) -> list[str]:
    """`stop` alone, checked as every endpoint checks it."""
    return SamplingFields.parse({"stop": body.get("stop")}, RequestContext(limits)).stop


def one_or_many(prompt: str | list) -> list[str | list[int]]:
    return [prompt] if isinstance(prompt, str) or isinstance(prompt[0], int) else prompt


class CompletionFields(Body):
    """/v1/completions' own fields. `prompt`: a string, token ids, or an array of either (one choice group
    per prompt); required (the default is refused)."""

    prompt: Annotated[
        Text | TokenIds | Annotated[list[Text | TokenIds], Field(min_length=1, fail_fast=True)],
        otherwise("prompt must be a non-empty string, an array of token ids, or an array of either"),
        AfterValidator(one_or_many),
    ] = Field(None, validate_default=True)
    logprobs: Annotated[int, within_top_logprobs()] | None = None  # the top k logprobs of each token
    # grpokit's: the image inputs of token-id prompts (grpokit.vision.inputs.to_base64), one set for every
    # prompt of the request (RemoteEngine: a group's prompt, or its continuations); read by ServedImages
    vision: str | None = None


class CompletionRequest(StreamFields, SamplingFields, CompletionFields):
    """A POST /v1/completions body: its own fields, the sampling ones, then `stream`."""

    max_tokens: AtLeastOne = DEFAULT_COMPLETION_TOKENS

    @property
    def params(self) -> SamplingRequest:
        return self.sampling(self.logprobs is not None, self.logprobs or 0)


class TextPart(TypedDict):  # strict, as the model that reads it
    type: Literal["text"]
    text: str


class ImageUrl(TypedDict):
    url: str
    detail: NotRequired[str]


class ImageUrlPart(TypedDict):  # OpenAI's image part; the server reads only data: URLs (ServedImages)
    type: Literal["image_url"]
    image_url: ImageUrl


class ImagePart(TypedDict):  # Hugging Face's and verifiers' image part
    type: Literal["image"]
    image: NotRequired[str]
    url: NotRequired[str]


def joined(parts: list[TextPart | ImageUrlPart | ImagePart]) -> str | list[dict]:
    """Text parts joined, as vLLM does for text models; content with an image part keeps its parts (for
    the processor: grpokit.inference.server.images)."""
    if any(p["type"] != "text" for p in parts):
        return [dict(p) for p in parts]
    return "\n".join(p["text"] for p in parts)


Part = Annotated[TextPart | ImageUrlPart | ImagePart, Field(discriminator="type")]


class Message(TypedDict):
    """A chat message: a string role and text content (text parts joined), or text and image parts."""

    role: str
    content: NotRequired[str | Annotated[list[Part], Field(fail_fast=True), AfterValidator(joined)] | None]


def chat_messages(messages: Any, handler: Callable[[Any], list[Message]]) -> list[dict]:
    """Each message as sent, every field of it for the chat template, its content's parts joined."""
    if not isinstance(messages, list) or not messages:
        raise refused("messages must be a non-empty array of {role, content} objects")
    try:
        checked = handler(messages)
    except ValidationError as e:
        i, *where = e.errors()[0]["loc"]
        if where[:1] != ["content"]:
            raise refused(f"messages[{i}] must be an object with a string role") from None
        if isinstance(messages[i]["content"], list):
            raise refused(
                f"messages[{i}].content: only text parts and image parts ({IMAGE_PART}) are supported"
            ) from None
        raise refused(f"messages[{i}].content must be a string or an array of text and image parts") from None
    return [{**sent, "content": message.get("content")} for sent, message in zip(messages, checked)]


class ChatFields(Body):
    """/v1/chat/completions' own fields."""

    messages: Annotated[list[Message], Field(fail_fast=True), WrapValidator(chat_messages)] = Field(
        None, validate_default=True
    )
    chat_template_kwargs: dict = Field(default_factory=dict)  # variables for the chat template
    chat_template: Any = Field(None, validate_default=True)  # vLLM's: a template of the request's own
    logprobs: bool = False
    top_logprobs: Annotated[int, within_top_logprobs()] = 0
    max_completion_tokens: AtLeastOne | None = None

    @field_validator("chat_template")
    @classmethod
    def _trusted_template(cls, own: Any, info: ValidationInfo) -> str | None:
        """The request's own template (`chat_template`, or `chat_template_kwargs.chat_template`), only
        where the server trusts it; and no chat_template_kwargs that apply_chat_template's own are."""
        kwargs = info.data.get("chat_template_kwargs", {})
        template, param = (own, "chat_template") if own is not None else (kwargs.get("chat_template"), KWARGS)
        if template is not None:
            if not info.context.limits.trust_request_chat_template:
                raise refused(
                    "this server renders only its own chat template: a template sent in the request is refused "
                    "(start the server with --server.limits.trust_request_chat_template true to allow it)",
                    param,
                )
            if not isinstance(template, str) or not template:
                raise refused("chat_template must be a non-empty string", param)
        reserved = sorted(RESERVED_TEMPLATE_KWARGS & set(kwargs))
        if reserved:
            raise refused(f"chat_template_kwargs.{reserved[0]} is set by the server, not by the request", KWARGS)
        return template

    @field_validator("top_logprobs")
    @classmethod
    def _needs_logprobs(cls, k: int, info: ValidationInfo) -> int:
        if k and not info.data.get("logprobs"):
            raise refused("top_logprobs needs logprobs: true")
        return k


class ChatCompletionRequest(StreamFields, SamplingFields, ChatFields):
    """A POST /v1/chat/completions body: its own fields, the sampling ones, then `stream`."""

    max_tokens: AtLeastOne | None = Field(None, validate_default=True)  # None: the rest of the context

    @field_validator("max_tokens", mode="wrap")
    @classmethod
    def _newer_name_first(cls, max_tokens: Any, handler: Callable[[Any], int | None], info: ValidationInfo) -> Any:
        """OpenAI's newer max_completion_tokens, when given, is the limit: max_tokens is then not read."""
        return info.data.get("max_completion_tokens") or handler(max_tokens)

    @property
    def template_kwargs(self) -> dict:
        kwargs = self.chat_template_kwargs
        return kwargs if self.chat_template is None else {**kwargs, "chat_template": self.chat_template}

    @property
    def params(self) -> SamplingRequest:
        return self.sampling(self.logprobs, self.top_logprobs)


def vllm_only(*defaults: Any) -> AfterValidator:
    return only(*defaults, refusal="sampling_params.{} is not supported by this server")


class GenerateSamplingFields(Fields):
    """What /inference/v1/generate's `sampling_params` holds besides the shared sampling fields: vLLM's
    SamplingParams fields that change what is sampled and that grpokit's engines do not do, refused but
    for vLLM's default (`vllm_only()`: any value but null), and `logprobs`, the top k logprobs shown
    (the sampled token's first). vLLM's fields that only shape text, and unknown ones, are ignored."""

    ignore_eos: Annotated[Any, vllm_only(False)] = None
    allowed_token_ids: Annotated[Any, vllm_only()] = None
    bad_words: Annotated[Any, vllm_only([])] = None
    structured_outputs: Annotated[Any, vllm_only()] = None
    prompt_logprobs: Annotated[Any, vllm_only()] = None
    logprob_token_ids: Annotated[Any, vllm_only()] = None
    prompt_logprob_token_ids: Annotated[Any, vllm_only()] = None
    truncate_prompt_tokens: Annotated[Any, vllm_only()] = None
    thinking_token_budget: Annotated[Any, vllm_only()] = None
    trace_decode_token_ids: Annotated[Any, vllm_only()] = None
    repetition_detection: Annotated[Any, vllm_only()] = None
    logprobs: Annotated[int, within_top_logprobs(sampled_first=True)] | None = None


class GenerateSampling(SamplingFields, GenerateSamplingFields):
    @property
    def params(self) -> SamplingRequest:
        k = self.logprobs  # the sampled token, then the engine's top k less it
        return self.sampling(k is not None, k if k is not None and k >= 2 else 0)


CONTENT_PART = '{"type": "image_url", "url": "data:image/png;base64,..."}'


def content_images(parts: Any) -> list[Any] | None:
    """`content_parts` (vLLM's pictures beside token ids before expansion) as the images' sources in order
    (None: none). Image parts only: another kind (audio, video, text) would not reach the model, so it is
    refused naming its index. Whether a source can be read is the engine thread's check (.images)."""
    if parts is None or parts == []:
        return None
    if not isinstance(parts, list):
        raise refused(f"content_parts must be an array of image parts ({CONTENT_PART})")
    sources = []
    for i, part in enumerate(parts):
        if not (isinstance(part, dict) and is_image_part(part)):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise refused(f"content_parts[{i}] is of type {kind!r}: only image parts ({CONTENT_PART}) are taken")
        try:
            sources.append(image_source(part))
        except ImageError as e:
            raise refused(f"content_parts[{i}]: {e}") from None
    return sources


def no_features(value: Any) -> Any:
    if value is not None:
        raise refused(
            "features (vLLM's processed tensors, in its own msgpack per model) is not taken: send the pictures "
            f"as content_parts ({CONTENT_PART}) with the token ids before expansion (renderers' "
            "process_multimodal=False), and the server's processor makes the tensors"
        )
    return value


class GenerateRequest(Body):
    """A POST /inference/v1/generate body: vLLM's token-in/token-out endpoint; with images, the ids before
    expansion and `content_parts`, vLLM's shape for pictures there (grpokit.inference.server.images)."""

    token_ids: Annotated[TokenIds, otherwise("token_ids must be a non-empty array of token ids")] = Field(
        None, validate_default=True
    )
    stream: bool = False
    features: Annotated[Any, AfterValidator(no_features)] = None
    content_parts: Annotated[Any, AfterValidator(content_images)] = None  # the images' sources, in order
    output_mode: str = "tokens"
    priority: int = 0  # vLLM's scheduling priority: one FIFO queue here, so only its type counts
    cache_salt: str | None = None  # no prefix cache to salt
    sampling_params: GenerateSampling = Field(default_factory=dict, validate_default=True)
    request_id: str | None = None
    return_token_ids: bool = False  # the prompt's token ids in the answer

    @field_validator("stream")
    @classmethod
    def _not_streamed(cls, stream: bool) -> bool:
        if stream:
            raise refused("stream is not supported on /inference/v1/generate")
        return stream

    @field_validator("output_mode")
    @classmethod
    def _tokens_out(cls, mode: str) -> str:
        if mode != "tokens":
            raise refused("output_mode must be tokens: this endpoint returns no text")
        return mode


@dataclass(frozen=True)
class PromptBudget:
    """How long one prompt may be, checked before the engine's work: at most `max_tokens` tokens and, before
    tokenising, at most `max_chars` characters of text. No token spans more characters than the longest
    vocabulary entry (`token_chars`; true of byte-level BPE and SentencePiece, whose entries are the
    text's bytes or characters), so a longer text has more tokens than the limit and is refused unread.
    `source` names where the limit comes from, for the error."""

    max_tokens: int | None
    token_chars: int
    source: str

    @classmethod
    def of(cls, context: int | None, max_prompt_tokens: int | None, token_chars: int) -> PromptBudget:
        limits = [(max_prompt_tokens, "server.limits.max_prompt_tokens")]
        if context is not None:
            limits.append((context - 1, f"this model's context of {context} tokens, less one for the completion"))
        limit, source = min(((v, s) for v, s in limits if v is not None), default=(None, "no limit"))
        return cls(limit, max(1, token_chars), source)

    @property
    def max_chars(self) -> int | None:
        return None if self.max_tokens is None else self.max_tokens * self.token_chars

    def check_tokens(self, count: int, param: str) -> None:
        if self.max_tokens is not None and count > self.max_tokens:
            raise RequestError(
                f"the prompt has {count} tokens, over the limit of {self.max_tokens} ({self.source})", param
            )

    def check_text(self, chars: int, param: str) -> None:
        if self.max_chars is not None and chars > self.max_chars:
            raise RequestError(
                f"the prompt has {chars} characters: more than {self.max_tokens} tokens, the limit "
                f"({self.source}), since no token spans more than {self.token_chars} characters",
                param,
            )

    def check_prompts(self, prompts: list[str | list[int]], vocab_size: int, param: str = "prompt") -> None:
        """Prompts (the field `param`): token ids within the vocabulary and the limit, texts within `max_chars`."""
        for p in prompts:
            if isinstance(p, str):
                self.check_text(len(p), param)
                continue
            self.check_tokens(len(p), param)
            if not all(0 <= t < vocab_size for t in p):
                what = "prompt token ids" if param == "prompt" else param
                raise RequestError(f"{what} must be in [0, {vocab_size})", param)

    def check_messages(self, messages: list[dict]) -> None:
        """Chat messages: no more than the token limit (each renders to at least one token), and their
        text (every field's, an image part's data not counted) within `max_chars` (the template only adds
        to it). A prompt with images is checked again once the processor has made its ids."""
        self.check_tokens(len(messages), "messages")
        chars = sum(
            text_chars(v) if k == "content" else len(str(v)) for m in messages for k, v in m.items() if v is not None
        )
        self.check_text(chars, "messages")


def text_chars(content: Any) -> int:
    """Characters of a message's content as text; of a list of content parts, their text parts' only."""
    if isinstance(content, list):
        return sum(len(p.get("text", "")) if isinstance(p, dict) else len(str(p)) for p in content)
    return len(str(content))


def check_rows(prompts: int, n: int, max_rows: int) -> None:
    """prompts x n, the rows the engine samples for one request, within server.limits.max_rows."""
    if prompts * n > max_rows:
        raise RequestError(
            f"{prompts} prompts x n={n} = {prompts * n} completions in one request, over "
            f"server.limits.max_rows={max_rows}: split the request",
            "n" if prompts == 1 else "prompt",
        )


def longest_token_chars(tokenizer) -> int:
    """Characters in the tokenizer's longest vocabulary entry, added tokens included."""
    return max(map(len, tokenizer.get_vocab()), default=1)
