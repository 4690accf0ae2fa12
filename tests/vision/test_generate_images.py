"""Pictures on vLLM's token-in route, `POST /inference/v1/generate`, through `grpokit infer`, on each tiny
family: vLLM's shape (`token_ids` before expansion, one placeholder token per picture, and `content_parts`
of `{"type": "image_url", "url": "data:..."}`, as renderers.client.generate sends it with
process_multimodal=False) samples exactly what the chat endpoint samples for the same prompt at
temperature 0, and answers the expanded `prompt_token_ids` and `mm_placeholders` that verifiers aligns
its renderer's ids with; pictures it cannot use are a 400 naming the field."""

from __future__ import annotations

import pytest

from grpokit.vision.images import to_data_url
from grpokit.vision.render import render_prompt
from tests.support.servers import serving
from tests.vision.pictures import striped
from tests.vision.test_served_images import post


def chat_and_template(processor) -> tuple[list[dict], list[dict], list[int], list[int]]:
    """(chat messages with two pictures of different sizes, the same pictures as content_parts, the chat's
    ids before expansion, after)."""
    pictures = [striped(56, 42, 5), striped(84, 56, 6)]
    urls = [to_data_url(picture) for picture in pictures]
    text = {"type": "text", "text": "Which shape is larger?"}
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": u}} for u in urls] + [text]}]
    shaped = [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, text]}]
    rendered = render_prompt(processor, shaped, pictures, keep_source=True)
    parts = [{"type": "image_url", "url": u} for u in urls]  # vLLM's (and renderers') flat content part
    return messages, parts, rendered.vision.source.template_ids, rendered.prompt_ids


def test_generate_with_pictures_samples_what_the_chat_endpoint_samples(vl_family):
    from verifiers.v1.graph import _project_prompt_attribution  # how verifiers aligns vLLM's expanded ids

    family, path, processor, _ = vl_family
    messages, parts, template_ids, prompt_ids = chat_and_template(processor)
    chat = {"model": "tiny", "messages": messages, "max_tokens": 5, "temperature": 0, "logprobs": True,
            "return_token_ids": True}  # fmt: skip
    body = {"model": "tiny", "token_ids": template_ids, "content_parts": parts, "return_token_ids": True,
            "sampling_params": {"max_tokens": 5, "temperature": 0, "logprobs": 1}}  # fmt: skip
    with serving(path) as (_, server):
        root = server.url.removesuffix("/v1")
        (chat_status, chatted), (status, answer) = (
            post(server.url, "/chat/completions", chat),
            post(root, "/inference/v1/generate", body),
        )
        one_picture = post(root, "/inference/v1/generate", {**body, "content_parts": parts[:1]})
    assert chat_status == 200 and status == 200, (chatted, answer)
    assert answer["prompt_token_ids"] == chatted["prompt_token_ids"] == prompt_ids
    (choice,), (chat_choice,) = answer["choices"], chatted["choices"]
    assert choice["token_ids"] == chat_choice["token_ids"] and choice["token_ids"]
    served = [entry["logprob"] for entry in choice["logprobs"]["content"]]
    assert served == pytest.approx([entry["logprob"] for entry in chat_choice["logprobs"]["content"]], abs=1e-5)
    image_id = processor.tokenizer.convert_tokens_to_ids(str(processor.image_token))
    ranges = [(r["offset"], r["length"]) for r in answer["mm_placeholders"]["image"]]
    assert len(ranges) == 2 and all(image_id in prompt_ids[at : at + n] for at, n in ranges)
    _project_prompt_attribution(template_ids, prompt_ids, {image_id: 1}, ranges, None, None)  # raises if unaligned
    print(f"{family}: {len(template_ids)} ids before expansion, {len(prompt_ids)} after, placeholders {ranges}")
    status, refusal = one_picture
    assert status == 400 and refusal["error"]["param"] == "content_parts", refusal
    assert "2 image placeholders" in refusal["error"]["message"] and "for 1 images" in refusal["error"]["message"]


def test_pictures_the_generate_route_cannot_use_are_refused_naming_the_field(vl_family, tiny_model):
    _, path, processor, _ = vl_family
    _, parts, template_ids, _ = chat_and_template(processor)
    body = {"model": "tiny", "token_ids": template_ids, "sampling_params": {"max_tokens": 2}}
    bad = {
        "unreadable": [{"type": "image_url", "url": "data:image/png;base64,AAAA"}] * 2,
        "not a data: URL": [{"type": "image_url", "url": "/etc/hostname"}] * 2,
        "is of type 'audio_url'": [parts[0], {"type": "audio_url", "url": parts[1]["url"]}],
    }
    with serving(path) as (_, server):
        root = server.url.removesuffix("/v1")
        answers = {why: post(root, "/inference/v1/generate", {**body, "content_parts": p}) for why, p in bad.items()}
        features = post(root, "/inference/v1/generate", {**body, "features": {"mm_hashes": {"image": ["a"]}}})
        top = post(root, "/inference/v1/generate", {**body, "content_parts": parts, "sampling_params": {"logprobs": 2}})
    with serving(tiny_model) as (_, server):
        text_body = {**body, "token_ids": [1, 2, 3], "content_parts": parts}
        text_only = post(server.url.removesuffix("/v1"), "/inference/v1/generate", text_body)
    for why, (status, answer) in answers.items():
        error = answer["error"]
        assert status == 400 and error["param"] == "content_parts" and why in error["message"], (why, answer)
    assert features[0] == 400 and features[1]["error"]["param"] == "features", features
    assert "send the pictures as content_parts" in features[1]["error"]["message"]
    assert top[0] == 400 and "top logprobs are not reported for prompts with images" in top[1]["error"]["message"]
    assert text_only[0] == 400 and text_only[1]["error"]["param"] == "content_parts", text_only
    assert "is a text-only model and takes no images" in text_only[1]["error"]["message"]
