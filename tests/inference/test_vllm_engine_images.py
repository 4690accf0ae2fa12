"""VLLMEngine's prompts with images against a stub of vLLM 0.32's token-in route (`/inference/v1/generate`):
what is sent (the ids before expansion, the pictures as PNG data URLs, the placeholders as stop tokens), the
check of vLLM's prompt ids, and the refusals at start. The real server: tests/integration/test_vllm_images.py."""

import json

import pytest
import torch
from PIL import Image

from grpokit.inference import SamplingSettings
from grpokit.inference.vllm.engine import VLLMEngine
from grpokit.vision.inputs import ImageSource, VisionInputs
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
