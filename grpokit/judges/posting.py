"""One JSON request to a judge's server, retried on what a retry may cure: what the HTTP judges share.

`post_json` sends `payload` to `url` and returns what `read` makes of the answer's body, or a Failure
("timeout": no answer within `timeout` seconds; "down": the server refused, could not be reached, or
answered something `read` rejects) once every try has failed. Connection errors, timeouts, 429 and 5xx
are retried `retries` times with exponential backoff (0.5 s doubling, at most MAX_BACKOFF apart); a 4xx
other than 429 is not (the same request would be refused again), and a redirect is refused (it would
carry the API key elsewhere: grpokit.inference.remote.OPENER follows none).
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from grpokit.inference.remote import OPENER

log = logging.getLogger(__name__)
MAX_BACKOFF = 10.0  # seconds between two tries of one request, at most
T = TypeVar("T")


@dataclass
class Failure:
    """A request that got no usable answer: its kind ("timeout", "down") and what happened."""

    kind: str
    detail: str


def post_json(
    url: str, payload: dict[str, Any], headers: dict[str, str], timeout: float, retries: int, read: Callable[[bytes], T]
) -> T | Failure:
    """POST `payload` as JSON; `read(body)` of the first good answer (a ValueError from it is a "down"
    answer, retried), or the last Failure."""
    body = json.dumps(payload).encode()
    failure = Failure("down", "")
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(min(MAX_BACKOFF, 0.5 * 2 ** (attempt - 1)))
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with OPENER.open(request, timeout=timeout) as response:
                return read(response.read())
        except urllib.error.HTTPError as e:
            failure = Failure("down", f"{url} answered {e.code}{error_message(e)}")
            if 300 <= e.code < 400 or (e.code < 500 and e.code != 429):
                break  # a redirect or a refusal: the same request will be refused again
        except (TimeoutError, ConnectionError, urllib.error.URLError, http.client.HTTPException) as e:
            reason = getattr(e, "reason", e)
            kind = "timeout" if isinstance(reason, TimeoutError) else "down"
            failure = Failure(kind, f"{url}: {type(reason).__name__}: {reason}")
        except ValueError as e:  # an answer that is not what the endpoint answers
            failure = Failure("down", str(e))
        log.warning("judge request failed (%s; try %d of %d)", failure.detail, attempt + 1, retries + 1)
    failure.detail += f" (after {attempt + 1} tries, timeout {timeout:g}s each)"
    return failure


def json_headers(api_key_var: str | None) -> dict[str, str]:
    """A JSON request's headers, with `Authorization: Bearer` from the environment variable the recipe
    names (never the key itself); a ValueError at build time when that variable is not set."""
    headers = {"Content-Type": "application/json"}
    if api_key_var is not None:
        if not os.environ.get(api_key_var):
            raise ValueError(f"judge.api_key_var names {api_key_var!r}, which is not set in the environment")
        headers["Authorization"] = f"Bearer {os.environ[api_key_var]}"
    return headers


def error_message(e: urllib.error.HTTPError) -> str:
    """The message of an OpenAI-style error body (`{"error": {"message"}}`), as ": message", or ""."""
    try:
        return f": {json.loads(e.read())['error']['message']}"
    except Exception:  # any other body: the status alone says enough
        return ""
