"""What one request may cost `grpokit infer`, and how the server holds up under load: the recipe's
`server.limits.*` keys. Every limit is checked before any tokenizer or engine work, and a request over one
is refused with an error that names the key (docs/reliability.md lists them with their defaults)."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class ServerLimits:
    """Limits of `grpokit infer`'s OpenAI-compatible server (`server.limits.*`).

    Args:
        max_n: completions per prompt (`n`) in one request.
        max_rows: prompts x `n` in one request: the rows the engine samples for it.
        max_body_bytes: request body size; a larger Content-Length is refused before the body is read.
        max_prompt_tokens: tokens in one prompt; null = the context length less one (room for one
            completion token). A text prompt longer than this many times the longest vocabulary entry
            (in characters) is refused before it is tokenised.
        max_queued_requests: requests waiting for the engine thread; more are answered 429 with a
            Retry-After estimated from the queue and recent request times.
        read_timeout: seconds a client has to send its request line and headers, and again its body;
            slower clients are answered 408 and disconnected.
        max_connections: open connections the server answers; a request on one more is answered 503
            with Retry-After: 1, naming this key, and that connection closed.
        backlog: the listen backlog: connections the kernel queues until the server accepts them.
        shutdown_timeout: seconds that SIGTERM (or close) waits for the request the engine is running;
            after that it is answered 503 and the server exits without waiting for the engine.
        trust_request_chat_template: render a Jinja chat template sent in a request (`chat_template`,
            `chat_template_kwargs.chat_template`). Off by default, as in vLLM
            (--trust-request-chat-template): a template is a program the server runs.
        max_top_logprobs: top logprobs per token a request may ask for (chat `top_logprobs`, completions
            and generate `logprobs`); vLLM's default max_logprobs, 20, which OpenAI's chat API allows
            too. 0 refuses them all.
        max_stop: stop strings in one request. OpenAI's API takes 4, vLLM any number; every decode step
            searches each completion's text for each of them.
        max_stop_chars: characters in one stop string.
    """

    max_n: int = 256
    max_rows: int = 1024
    max_body_bytes: int = 16 * 2**20
    max_prompt_tokens: int | None = None
    max_queued_requests: int = 256
    read_timeout: float = 30.0
    max_connections: int = 1024
    backlog: int = 2048
    shutdown_timeout: float = 3.0
    trust_request_chat_template: bool = False
    max_top_logprobs: int = 20
    max_stop: int = 16
    max_stop_chars: int = 256

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "trust_request_chat_template" or (f.name == "max_prompt_tokens" and value is None):
                continue
            zero_ok = f.name == "max_top_logprobs"
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not (value > 0 or zero_ok and value == 0)
            ):
                relation = ">= 0" if zero_ok else "> 0"
                raise ValueError(f"server.limits.{f.name} must be a number {relation}, got {value!r}")
        if self.max_n > self.max_rows:
            raise ValueError(
                f"server.limits.max_n ({self.max_n}) exceeds server.limits.max_rows ({self.max_rows}): "
                "a request with n = max_n would be refused anyway; raise max_rows or lower max_n"
            )
