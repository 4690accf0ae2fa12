"""The refusals of grpokit's server: RequestError, answered as OpenAI-style error JSON, and the pydantic
errors of the request models (grpokit.inference.server.requests) turned into it.

A request model's validators raise `refused(message)` (the whole answer) or `unmet(requirement)` (a
range: "<field> must be <requirement>, got <value>"); pydantic's own type errors become "<field> must be
an integer, got ...". Fields are checked in order and the first error is answered, naming its field
(without the `sampling_params.` prefix on /inference/v1/generate, as vLLM's clients read it)."""

from __future__ import annotations

import json
from typing import TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails, PydanticCustomError

ERROR_TYPES = {
    400: "BadRequestError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    405: "MethodNotAllowed",
    408: "RequestTimeout",
    409: "Conflict",
    413: "RequestTooLarge",
    429: "RateLimitError",
    503: "ServiceUnavailable",
}
# pydantic's type errors (strict JSON types), as the answer names the type a field takes
TYPE_NAMES = {
    "bool_type": "a boolean",
    "int_type": "an integer",
    "float_type": "a number",
    "string_type": "a string",
    "dict_type": "an object",
    "model_type": "an object",
}


class RequestError(Exception):
    """A client error (or an overloaded or stopping server), answered with `status` and an OpenAI-style
    error body naming `param`; `retry_after` (seconds) becomes a Retry-After header."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, retry_after: int | None = None):
        super().__init__(message)
        self.message, self.param, self.status, self.retry_after = message, param, status, retry_after

    def headers(self) -> dict[str, str]:
        return {} if self.retry_after is None else {"Retry-After": str(self.retry_after)}

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": ERROR_TYPES.get(self.status, "ServiceUnavailable"),
                "param": self.param,
                "code": self.status,
            }
        }


def refused(message: str, param: str | None = None, status: int = 400) -> PydanticCustomError:
    """A validator's refusal, answered with `message` as it is; `param`: the field it names, when not
    the one being checked."""
    return PydanticCustomError("refused", "{message}", {"message": message, "param": param, "status": status})


def unmet(requirement: str) -> PydanticCustomError:
    """A value outside its field's range, answered "<field> must be <requirement>, got <value>"."""
    return PydanticCustomError("requirement", "must be {requirement}", {"requirement": requirement})


def request_error(error: ErrorDetails) -> RequestError:
    """One pydantic error as the server's answer to it."""
    kind, got, ctx = error["type"], error["input"], error.get("ctx", {})
    name = next((part for part in reversed(error["loc"]) if isinstance(part, str)), None)
    if kind == "refused":
        return RequestError(ctx["message"], ctx["param"] or name, ctx["status"])
    if kind == "requirement":
        return RequestError(f"{name} must be {ctx['requirement']}, got {got!r}", name)
    if kind == "finite_number" or (kind == "float_type" and type(got) is int):  # an integer past float's range
        return RequestError(f"{name} must be a finite number, got {json.dumps(got)[:60]}", name)
    if kind in TYPE_NAMES:
        return RequestError(f"{name} must be {TYPE_NAMES[kind]}, got {json.dumps(got)[:60]}", name)
    return RequestError(f"{name}: {error['msg']}", name)  # no model field raises another kind


Model = TypeVar("Model", bound=BaseModel)


def validate(model: type[Model], body: object, context: object) -> Model:
    """`body` read as `model` (`context`: what its validators check against), or the RequestError of its
    first error."""
    try:
        return model.model_validate(body, context=context)
    except ValidationError as e:
        raise request_error(e.errors(include_url=False)[0]) from None
