"""VLLMEngine's prompts with images against a stub of vLLM 0.32's token-in route (`/inference/v1/generate`):
what is sent (the ids before expansion, the pictures as PNG data URLs, the placeholders as stop tokens), the
check of vLLM's prompt ids, and the refusals at start; a later turn of a conversation that brought pictures
(the whole conversation's ids before expansion, every picture in order). The real server:
tests/integration/test_vllm_images.py; a real processor's expansion: tests/vision/test_vllm_later_turns.py."""

import json

import pytest
import torch
from PIL import Image

from grpokit.inference import SamplingSettings
from grpokit.inference.vllm.engine import VLLMEngine
from grpokit.vision.images import load_image
from grpokit.vision.inputs import ImageSource, VisionInputs, with_turn
from tests.support.servers import JsonStub, stub_server

PLACEHOLDER = 99  # the stub model's image token: vLLM expands one into three


class StubGenerate(JsonStub):
    """vLLM's generate route: each placeholder expanded (or `expand` times), choices ending as `tails` say."""

    calls: list[dict] = []
    status = 200
    expand = 3

    def answer(self, path: str, body: dict) -> tuple[int, bytes]:
        StubGenerate.calls.append({"path": path, **body})
        code, answer = StubGenerate.status, {"error": {"message": "refused"}}
        if code == 200 and not body:
            code = 400  # an empty request: the route is there
        elif code == 200:
            ids = [t for k in body["token_ids"] for t in ([k] * self.expand if k == PLACEHOLDER else [k])]
            n = body["sampling_params"]["n"]
            tails = [[5, 6], [5, PLACEHOLDER]]  # the second choice stopped at a placeholder
            choices = [{"index": i, "token_ids": tails[i % 2], "finish_reason": "stop"} for i in range(n)]
            for c in choices:
                c["logprobs"] = {"content": [{"token_id": t, "logprob": -1.0} for t in c["token_ids"]]}
            answer = {"model": body["model"], "prompt_token_ids": ids, "choices": choices}
        return code, json.dumps(answer).encode()


@pytest.fixture
def engine():
    StubGenerate.calls, StubGenerate.status, StubGenerate.expand = [], 200, 3
    with stub_server(StubGenerate) as url:
        engine = VLLMEngine(base_url=url, model_name="base", max_retries=0)
        engine.setup("unused")
        engine.vocab_size = 1000  # no tokenizer to read it from
        engine._placeholders = {PLACEHOLDER}  # else read from the model folder's config
        yield engine


def image_prompt() -> tuple[list[int], VisionInputs]:
    prompt = [1, 2, PLACEHOLDER, PLACEHOLDER, PLACEHOLDER, 3]  # as grpokit's processor expanded it
    vision = VisionInputs({"pixel_values": torch.zeros(1, 3)}, {"pixel_values": 0})
    vision.source = ImageSource([Image.new("RGB", (4, 4), "red")], [1, 2, PLACEHOLDER, 3], prompt)
    return prompt, vision


def test_an_image_prompt_goes_to_the_token_in_route_before_expansion(engine):
    prompt, vision = image_prompt()
    assert engine.samples_images and engine.takes_vision
    sampling = SamplingSettings(temperature=1.0, max_tokens=4, seed=1, stop_token_ids=[7])
    (group,) = engine.generate([prompt], 2, sampling, vision=[vision])
    sent = [c for c in StubGenerate.calls if c.get("token_ids")]
    assert [c["path"] for c in sent] == ["/inference/v1/generate"]
    assert sent[0]["token_ids"] == [1, 2, PLACEHOLDER, 3] and sent[0]["return_token_ids"] is True
    assert sent[0]["content_parts"][0]["url"].startswith("data:image/png;base64,")
    assert sent[0]["sampling_params"]["stop_token_ids"] == [7, PLACEHOLDER]
    assert sent[0]["sampling_params"]["logprobs"] == 0 and sent[0]["sampling_params"]["n"] == 2
    assert [c.token_ids for c in group] == [[5, 6], [5]]  # a placeholder ends a completion and is dropped
    assert [c.logprobs for c in group] == [[-1.0, -1.0], [-1.0]]
    assert [c.finish_reason for c in group] == ["stop", "stop"]


def test_continuations_are_one_request_per_row_each_checked(engine):
    prompt, vision = image_prompt()
    body = engine._body([prompt, prompt + [5, 6]], 1, SamplingSettings(max_tokens=4), 0, vision)
    answer = engine._post((engine.base_urls[0], body))
    sent = [c["token_ids"] for c in StubGenerate.calls if c.get("token_ids")]
    assert sent == [[1, 2, PLACEHOLDER, 3], [1, 2, PLACEHOLDER, 3, 5, 6]]
    assert [c["index"] for c in answer["choices"]] == [0, 1]


def test_other_prompt_ids_from_vllm_stop_the_run_naming_the_difference(engine):
    prompt, vision = image_prompt()
    StubGenerate.expand = 4  # vLLM's processor makes four placeholders of the image, grpokit's three
    with pytest.raises(ValueError, match=r"7 ids, not 6, first difference at position 5 .*grpokit infer"):
        engine.generate([prompt], 1, SamplingSettings(max_tokens=4), vision=[vision])


def test_image_inputs_without_their_pictures_are_refused(engine):
    prompt, vision = image_prompt()
    vision.source = None  # e.g. read back from a batch file
    with pytest.raises(ValueError, match="without their pictures"):
        engine.generate([prompt], 1, SamplingSettings(max_tokens=4), vision=[vision])


@pytest.mark.parametrize("status,fix", [(403, "--enable-scale-out"), (404, "has no /inference/v1/generate")])
def test_a_server_without_the_route_is_refused_at_start(engine, status, fix):
    StubGenerate.status = status
    with pytest.raises(ValueError, match=fix):
        assert engine.samples_images


def later_turn(vision: VisionInputs, before: list[int], template: list[int], colour: str) -> VisionInputs:
    """`vision` grown by a later turn after the ids `before`: one picture, `template` its ids before expansion."""
    expanded = [t for k in template for t in ([k] * 3 if k == PLACEHOLDER else [k])]
    turn = VisionInputs({"pixel_values": torch.ones(1, 3)}, {"pixel_values": 0})
    turn.source = ImageSource([Image.new("RGB", (4, 4), colour)], template, expanded)
    return with_turn(vision, turn, before)


def sent_pictures(call: dict) -> list[tuple]:
    return [load_image(part["url"]).getpixel((0, 0)) for part in call["content_parts"]]


def test_a_later_turn_sends_the_whole_conversation_before_expansion_with_every_picture(engine):
    """prompt (a picture) + reply + text turn + a turn with a picture + reply + a turn with another picture:
    each later request's ids are the whole conversation's before expansion, its pictures all of them in
    order, and vLLM's expansion of them is grpokit's ids (else completions_answer would refuse it)."""
    prompt, vision = image_prompt()  # a red picture
    before = prompt + [5, 6, 7]  # a reply (5, 6), a text turn (7)
    vision = later_turn(vision, before, [8, PLACEHOLDER, 9], "blue")
    ids = before + [8, PLACEHOLDER, PLACEHOLDER, PLACEHOLDER, 9]
    assert vision.source.prompt_ids == ids and len(vision.source.images) == 2
    (group,) = engine.generate([ids], 1, SamplingSettings(max_tokens=4), vision=[vision])
    vision = later_turn(vision, ids + [5, 6], [10, PLACEHOLDER], "green")  # another reply, another picture
    ids += [5, 6, 10, PLACEHOLDER, PLACEHOLDER, PLACEHOLDER]
    engine.generate([ids + [11]], 1, SamplingSettings(max_tokens=4), vision=[vision])  # a text turn after it
    first, second = [c for c in StubGenerate.calls if c.get("token_ids")]
    assert first["token_ids"] == [1, 2, PLACEHOLDER, 3, 5, 6, 7, 8, PLACEHOLDER, 9]
    assert second["token_ids"] == [1, 2, PLACEHOLDER, 3, 5, 6, 7, 8, PLACEHOLDER, 9, 5, 6, 10, PLACEHOLDER, 11]
    assert sent_pictures(first) == [(255, 0, 0), (0, 0, 255)]
    assert sent_pictures(second) == [(255, 0, 0), (0, 0, 255), (0, 128, 0)]
    assert [c.token_ids for c in group] == [[5, 6]]


def test_a_text_first_prompt_then_a_picture_sends_its_text_ids_as_they_are(engine):
    before = [1, 2, 3, 5, 6]  # a text prompt and a reply: no placeholder to expand
    vision = later_turn(None, before, [8, PLACEHOLDER], "blue")
    assert vision.source.template_ids == before + [8, PLACEHOLDER] and vision.prompt_part is not None
    engine.generate([vision.source.prompt_ids], 1, SamplingSettings(max_tokens=4), vision=[vision])
    (call,) = [c for c in StubGenerate.calls if c.get("token_ids")]
    assert call["token_ids"] == [1, 2, 3, 5, 6, 8, PLACEHOLDER] and sent_pictures(call) == [(0, 0, 255)]


def test_a_later_turn_after_pictures_without_their_source_is_refused(engine):
    prompt, vision = image_prompt()
    vision.source = None  # e.g. read back from a batch file: its ids before expansion are unknown
    vision = later_turn(vision, prompt + [5], [8, PLACEHOLDER], "blue")
    assert vision.source is None
    with pytest.raises(ValueError, match="without their pictures"):
        engine.generate([prompt + [5, 8, PLACEHOLDER]], 1, SamplingSettings(max_tokens=4), vision=[vision])
    _, vision = image_prompt()
    with pytest.raises(ValueError, match="do not begin with the ids its earlier pictures were rendered into"):
        later_turn(vision, [1, 2, 3], [8, PLACEHOLDER], "blue")
