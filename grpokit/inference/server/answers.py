"""The server's answers in OpenAI's shapes: a completion's text (cut before its stop string), per-token
logprobs with their top alternatives (chat's `logprobs.content`, completions' `logprobs`), and the
envelope (id, usage, grpokit's `weight_step`) around the choices. Used by the plain answers
(grpokit.inference.server.http) and the streamed ones (grpokit.inference.server.stream) alike."""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection
from itertools import accumulate

from grpokit.inference import Completion

MIN_LOGPROB = -9999.0  # JSON has no -inf; vLLM clamps the same way

Top = list[tuple[int, float]]  # one token's most likely alternatives: (token id, logprob), most likely first


def finish_reason(c: Completion) -> str:
    return c.finish_reason or ("length" if c.is_truncated else "stop")


def logprob(value: float) -> float:
    return max(value, MIN_LOGPROB)


class Answers:
    """Text and logprobs of completions as the API shows them, for one tokenizer."""

    def __init__(self, tokenizer, model_name: str) -> None:
        self.tokenizer, self.model_name = tokenizer, model_name
        self._token_text: dict[int, str] = {}  # at most the vocabulary

    def token_text(self, token_id: int) -> str:
        """One token as text, as OpenAI's `token` fields show it (special tokens included)."""
        text = self._token_text.get(token_id)
        if text is None:
            text = self._token_text[token_id] = self.tokenizer.decode([token_id])
        return text

    def decode(self, token_ids: list[int]) -> str:
        """A completion's text: special tokens (EOS) left out."""
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def text(self, c: Completion, stop: list[str], stop_token_ids: Collection[int] = ()) -> str:
        """The completion's text, ending before its first stop string (as in OpenAI's API) and without
        the stop token id that ended it (as vLLM's text)."""
        ids = c.token_ids
        if ids and ids[-1] in stop_token_ids:
            ids = ids[:-1]
        return cut_at_stop(self.decode(ids), stop)

    def chat_logprobs(self, token_ids: list[int], logprobs: list[float], tops: list[Top] | None) -> list[dict]:
        """Chat's `logprobs.content`: {token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]} per token."""
        out = []
        for i, (t, lp) in enumerate(zip(token_ids, logprobs)):
            s = self.token_text(t)
            top = [] if tops is None else [self._entry(u, v) for u, v in tops[i]]
            out.append({"token": s, "logprob": logprob(lp), "bytes": list(s.encode()), "top_logprobs": top})
        return out

    def completion_logprobs(
        self, token_ids: list[int], logprobs: list[float], tops: list[Top] | None, offset: int = 0
    ) -> dict:
        """Completions' `logprobs`: tokens, token_logprobs, text_offset (from `offset`) and top_logprobs, a
        {token: logprob} per token of its top alternatives and itself (OpenAI: up to logprobs + 1 entries)."""
        tokens = [self.token_text(t) for t in token_ids]
        values = [logprob(lp) for lp in logprobs]
        top_logprobs = []
        for i, (s, lp) in enumerate(zip(tokens, values)):
            alternatives = {} if tops is None else {self.token_text(u): logprob(v) for u, v in tops[i]}
            alternatives.setdefault(s, lp)
            top_logprobs.append(alternatives)
        return {
            "tokens": tokens,
            "token_logprobs": values,
            "top_logprobs": top_logprobs,
            "text_offset": list(accumulate(map(len, tokens), initial=offset))[:-1],
        }

    def _entry(self, token_id: int, value: float) -> dict:
        s = self.token_text(token_id)
        return {"token": s, "logprob": logprob(value), "bytes": list(s.encode())}

    def envelope(self, prefix: str, kind: str, choices: list[dict], prompts: list[list[int]], groups) -> dict:
        """The answer around `choices`: id, object, created, model, usage, weight_step."""
        return {
            "id": new_id(prefix),
            "object": kind,
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": usage(prompts, groups),
            "weight_step": min(c.policy_step for group in groups for c in group),
        }


def generate_logprobs(token_ids: list[int], logprobs: list[float], tops: list[Top] | None, k: int) -> list[dict]:
    """`logprobs.content` of vLLM's /inference/v1/generate for `sampling_params.logprobs: k`: per token
    `{token: "token_id:<id>", token_id, logprob, bytes: null, top_logprobs}`, where top_logprobs are the
    sampled token, then the most likely others (`tops`), max(k, 1) in all: the first entries of vLLM's
    logprobs dict, which holds the sampled token first."""
    out = []
    for i, (t, lp) in enumerate(zip(token_ids, logprobs)):
        first = [(t, lp)] + [(u, v) for u, v in (tops[i] if tops is not None else ()) if u != t]
        top = [{"token": f"token_id:{u}", "token_id": u, "logprob": logprob(v), "bytes": None} for u, v in first]
        out.append({**top[0], "top_logprobs": top[: max(k, 1)]})
    return out


def generate_answer(
    request_id: str, model: str, prompt: list[int], group: list[Completion], k: int | None, return_prompt: bool
) -> dict:
    """vLLM's /inference/v1/generate answer for one prompt's completions (`k`: sampling_params.logprobs,
    None for no logprobs), plus grpokit's `weight_step`; `return_prompt`: the prompt's ids as sampled."""
    choices = [
        {
            "index": i,
            "token_ids": c.token_ids,
            "logprobs": (
                {"content": generate_logprobs(c.token_ids, c.logprobs, c.top_logprobs, k)} if k is not None else None
            ),
            "finish_reason": finish_reason(c),
        }
        for i, c in enumerate(group)
    ]
    return {
        "request_id": request_id,
        "model": model,
        "created": int(time.time()),
        "choices": choices,
        "usage": usage([prompt], [group]),
        "prompt_logprobs": None,
        "prompt_token_ids": prompt if return_prompt else None,
        "weight_step": min(c.policy_step for c in group),
    }


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompts: list[list[int]], groups: list[list[Completion]]) -> dict:
    prompt_tokens = sum(map(len, prompts))
    completion_tokens = sum(len(c.token_ids) for group in groups for c in group)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def cut_at_stop(text: str, stop: list[str]) -> str:
    """`text` up to its first stop string."""
    return text[: min((i for i in (text.find(s) for s in stop) if i >= 0), default=len(text))]
