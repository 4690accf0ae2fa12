"""`grpokit infer`'s OpenAI-compatible HTTP server in front of any InferenceEngine, and its request checks.

The names below load on first use (PEP 562): `grpokit fit`, `train` and `orchestrate` import this
package for `ServerLimits` (grpokit.inference.server.limits) and so never pay for, nor need, starlette
and uvicorn, which only `grpokit infer` runs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from grpokit.inference.server.http import OpenAIApp, make_app, make_server, serve

__all__ = ["OpenAIApp", "make_app", "make_server", "serve"]  # importable as grpokit.inference.server, as before


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("grpokit.inference.server.http"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
