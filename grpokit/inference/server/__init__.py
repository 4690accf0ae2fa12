"""`grpokit infer`'s OpenAI-compatible HTTP server in front of any InferenceEngine, and its request checks."""

from grpokit.inference.server.http import OpenAIApp, make_app, make_server, serve

__all__ = ["OpenAIApp", "make_app", "make_server", "serve"]  # importable as grpokit.inference.server, as before
