"""Prompts with images on vLLM: its token-in route with the pictures, the prompt ids checked against grpokit's.

vLLM's OpenAI routes take no image tensors with token ids (`/v1/completions` has no multimodal input), and
its `features` field (vLLM's own msgpack of processed tensors, per model) leaves out the placeholder masks
Idefics3 needs. What vLLM 0.32 does take is `POST /inference/v1/generate` (served with `--enable-scale-out`)
with `token_ids` and `content_parts` (`{"type": "image_url", "url": "data:..."}`): vLLM loads the pictures,
runs the model's processor on them and expands each image's placeholder token in the ids itself. Given ids
already expanded, it expands them again (measured on Idefics3: 45 ids became 77). So a group is sent as
the prompt's ids before expansion (ImageSource.template_ids) and its pictures as lossless PNG data URLs,
and vLLM's `prompt_token_ids` (`return_token_ids`) must equal the ids grpokit samples and the trainer
scores: a ValueError names the first difference otherwise, rather than train on other ids.

vLLM's processor makes the pixel values again from the same pictures with the model folder's processor
config, so the logprobs are the trainer's (tests/integration/test_vllm_images.py measures them). A
continuation (a streamed request cut short) is one request per row: its template ids plus the row's tokens.
A later turn of a conversation is such a request too: its ImageSource is the conversation's so far, grown
by each environment turn that brought pictures (grpokit.vision.inputs.grown_source: the prompt, replies and
environment turns before expansion, every picture in order), and its ids go on with the replies and text
turns since, which hold no placeholder.
An image placeholder token ends a completion and is dropped from it, as on grpokit's engines (it has no
pixels for the trainer): the placeholders are stop tokens, and vLLM's stop token is removed.
"""

from __future__ import annotations

from grpokit.vision.images import to_data_url
from grpokit.vision.inputs import VisionInputs

GENERATE = "inference/v1/generate"
SAMPLING_KEYS = ("n", "max_tokens", "temperature", "top_p", "seed", "stop", "min_tokens", "repetition_penalty")


def generate_requests(body: dict, vision: VisionInputs, placeholders: set[int]) -> list[tuple[dict, list[int]]]:
    """A completions `body` (RemoteEngine._body) for an image prompt as `/inference/v1/generate` requests,
    each with the prompt ids vLLM must answer: one request for a prompt, one per row for continuations."""
    source = vision.source
    if source is None:
        raise ValueError(
            "this prompt's image inputs came without their pictures (ImageSource): VLLMEngine samples images "
            "only for prompts and later turns rendered in this process (grpokit.orchestrator.image_prompts, "
            "grpokit.environments.image_turns)"
        )
    prompts = body["prompt"] if body["prompt"] and isinstance(body["prompt"][0], list) else [body["prompt"]]
    params = {k: body[k] for k in SAMPLING_KEYS if body.get(k) is not None}
    params["stop_token_ids"] = sorted(set(body.get("stop_token_ids") or []) | placeholders)
    params["logprobs"] = 0
    parts = [{"type": "image_url", "url": to_data_url(image)} for image in source.images]
    requests = []
    for ids in prompts:
        cut = len(source.prompt_ids)
        if ids[:cut] != source.prompt_ids:
            raise ValueError("a prompt with images does not begin with the ids its images were rendered into")
        request = {
            "model": body["model"],
            "token_ids": source.template_ids + ids[cut:],
            "sampling_params": params,
            "return_token_ids": True,
            "content_parts": parts,
        }
        if "priority" in body:
            request["priority"] = body["priority"]
        requests.append((request, ids))
    return requests


def completions_answer(url: str, answers: list[dict], expected: list[list[int]], placeholders: set[int]) -> dict:
    """The generate route's answers as one completions answer (RemoteEngine._completion reads it); a
    ValueError when vLLM's prompt ids are not grpokit's."""
    choices = []
    for i, (answer, ids) in enumerate(zip(answers, expected)):
        check_prompt_ids(url, answer.get("prompt_token_ids"), ids)
        for choice in answer.get("choices") or []:
            content = (choice.get("logprobs") or {}).get("content") or []
            tokens, logprobs = list(choice.get("token_ids") or []), [entry.get("logprob") for entry in content]
            reason = choice.get("finish_reason")
            if tokens and tokens[-1] in placeholders and len(logprobs) == len(tokens):
                tokens, logprobs, reason = tokens[:-1], logprobs[:-1], "stop"
            index = choice.get("index") if len(answers) == 1 else i
            choices.append({"index": index, "token_ids": tokens, "logprobs": {"token_logprobs": logprobs}})
            choices[-1]["finish_reason"] = reason
    return {"model": answers[0].get("model") if answers else None, "choices": choices}


def check_prompt_ids(url: str, got: object, ids: list[int]) -> None:
    """ValueError unless vLLM sampled from exactly `ids` (the ids the trainer scores)."""
    if got == ids:
        return
    if not isinstance(got, list):
        raise ValueError(f"vLLM at {url} answered no prompt_token_ids for a prompt with images (return_token_ids)")
    at = next((i for i, (a, b) in enumerate(zip(got, ids)) if a != b), min(len(got), len(ids)))
    raise ValueError(
        f"vLLM at {url} expanded this prompt's images into other ids than grpokit's processor: {len(got)} ids, "
        f"not {len(ids)}, first difference at position {at} (vLLM {got[at : at + 4]}, grpokit {ids[at : at + 4]}). "
        "The trainer scores grpokit's ids, so the run stops here: serve the model folder with its own processor "
        "config (no --mm-processor-kwargs), or sample images with BuiltinEngine or `grpokit infer`"
    )


def route_error(url: str, code: int, detail: str) -> str | None:
    """Why a server's answer to an empty `/inference/v1/generate` request means it cannot take images
    (None: the route is there, and refused the empty request)."""
    if code == 403:
        return (
            f"vLLM at {url} serves /inference/v1/generate only with --enable-scale-out, and VLLMEngine sends "
            "prompts with images there: start it with --enable-scale-out (grpokit's `serve` adds it for a "
            "vision-language model)"
        )
    if code in (404, 405):
        return f"{url} has no /inference/v1/generate ({code}: {detail[:200]}): VLLMEngine needs vLLM 0.32 for images"
    return None
