"""Image prompts through `grpokit infer` and RemoteEngine, on each tiny family: the chat endpoint renders
image parts with the model's processor and samples them token-faithfully; a text-only model refuses them
naming the fix; RemoteEngine sends a group's image inputs with its token ids (whole batches and streamed
requests) and gets back exactly what the in-process engine samples, the trainer's logprobs; and
`grpokit infer` + `orchestrate` + `train` train on the shapes environment's pictures token-faithfully."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
import torch

from grpokit.common.logprobs import packed_token_logprobs
from grpokit.inference import SamplingSettings
from grpokit.inference.image_rows import sample_image_group
from grpokit.inference.remote import RemoteEngine
from grpokit.inference.streams import GroupRequest
from grpokit.orchestrator.packing import pack
from grpokit.trainer.metrics import mismatch_metrics
from grpokit.types import Rollout
from grpokit.vision.images import to_data_url
from grpokit.vision.inputs import VisionInputs, to_base64
from grpokit.vision.render import render_prompt
from tests.support import drain
from tests.support.servers import serving
from tests.vision.pictures import striped


def post(url: str, path: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def image_prompt(processor, seed: int, images: int = 2):
    content = [{"type": "image"}] * images + [{"type": "text", "text": f"What colour is shape {seed}?"}]
    pictures = [striped(56 + 14 * k, 42, seed + k) for k in range(images)]
    return render_prompt(processor, [{"role": "user", "content": content}], pictures), pictures


def trainer_error(model, prompt_ids: list[int], vision: VisionInputs, completions, temperature: float) -> float:
    """token_mult_prob_error of completions' logprobs (the server's) against the trainer's packed forward."""
    rollouts = [
        Rollout(
            0, "shapes", 0, prompt_ids, c.token_ids, c.logprobs, [1] * len(c.token_ids), 1.0, False, 0, vision=vision
        )  # fmt: skip
        for c in completions
    ]
    (mb,) = pack(rollouts, [[1.0] * len(r.completion_ids) for r in rollouts], [True] * len(rollouts), seq_len=2048)
    with torch.no_grad():
        trainer_T = packed_token_logprobs(
            model, mb.input_ids_T, mb.position_ids_T, mb.seq_lens_N, temperature or 1.0, vision=mb.vision
        )
    assert mb.num_loss_tokens == sum(len(c.token_ids) for c in completions) > 0
    return float(mismatch_metrics(trainer_T, mb.inference_logprobs_T, mb.loss_mask_T)["token_mult_prob_error"])


class Choice:  # a chat choice as the trainer_error helper reads a Completion
    def __init__(self, choice: dict) -> None:
        self.token_ids = choice["token_ids"]
        self.logprobs = [c["logprob"] for c in choice["logprobs"]["content"]]


def test_the_chat_endpoint_renders_image_parts_and_samples_them_token_faithfully(vl_family):
    family, path, processor, _ = vl_family
    rendered, pictures = image_prompt(processor, seed=3)
    content = [
        {"type": "image_url", "image_url": {"url": to_data_url(pictures[0])}},  # OpenAI's part
        {"type": "image", "image": to_data_url(pictures[1])},  # Hugging Face's and verifiers'
        {"type": "text", "text": "What colour is shape 3?"},
    ]
    body = {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 6, "n": 2,
            "temperature": 1.0, "seed": 3, "logprobs": True, "return_token_ids": True}  # fmt: skip
    with serving(path) as (engine, server):
        status, answer = post(server.url, "/chat/completions", body)
        assert status == 200, answer
        streamed = urllib.request.urlopen(
            urllib.request.Request(
                server.url + "/chat/completions",
                json.dumps({**body, "stream": True}).encode(),
                {"Content-Type": "application/json"},
            ),
            timeout=300,
        ).read()
        models = json.loads(urllib.request.urlopen(server.url + "/models", timeout=60).read())
        file_part = {"type": "image", "image": "/etc/hostname"}  # a path on the server: never opened
        refused, error = post(
            server.url, "/chat/completions", {**body, "messages": [{"role": "user", "content": [file_part]}]}
        )
        assert models["data"][0]["images"] is True
        assert answer["prompt_token_ids"] == rendered.prompt_ids  # the processor's ids, placeholders expanded
        assert answer["usage"]["prompt_tokens"] == len(rendered.prompt_ids)
        errors = [trainer_error(engine.model, rendered.prompt_ids, rendered.vision, [Choice(c)], 1.0)
                  for c in answer["choices"]]  # fmt: skip
    print(f"{family}: chat with images, token_mult_prob_error {errors}")
    assert all(abs(e - 1) < 1e-4 for e in errors), errors
    assert [len(c["token_ids"]) for c in answer["choices"]] != [0, 0]
    chunks = [json.loads(line[5:]) for line in streamed.split(b"\n") if line.startswith(b"data: {")]
    assert chunks and all("choices" in c for c in chunks)
    assert refused == 400 and "not a data: URL" in error["error"]["message"], error


def test_a_text_only_model_refuses_images_naming_the_fix(tiny_model):
    image = {"type": "image_url", "image_url": {"url": to_data_url(striped(28, 28, 1))}}
    chat = {"model": "tiny", "messages": [{"role": "user", "content": [image, {"type": "text", "text": "hi"}]}]}
    vision = VisionInputs({"pixel_values": torch.zeros(4, 8)}, {"pixel_values": 0})
    completion = {"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 2, "vision": to_base64(vision)}
    with serving(tiny_model) as (_, server):
        answers = [post(server.url, "/chat/completions", chat), post(server.url, "/completions", completion)]
        remote = RemoteEngine(base_url=server.url, model_name="tiny", max_retries=0)
        remote.setup(tiny_model)
        with pytest.raises(ValueError, match="does not sample prompts with images .* serve a vision-language model"):
            assert not remote.samples_images
    for (status, answer), param in zip(answers, ["messages", "vision"]):
        assert status == 400 and answer["error"]["param"] == param, answer
        assert "is a text-only model and takes no images: serve a vision-language model" in answer["error"]["message"]


def test_remote_engine_sends_an_image_groups_inputs_and_gets_the_engines_sample(vl_family):
    """RemoteEngine in front of `grpokit infer`: a whole batch (an image prompt beside a text one) and a
    streamed group (`stream: true`, the interrupting stream's path) come back with the ids and logprobs
    the in-process engine samples with the same seed, which the trainer's forward reproduces."""
    family, path, processor, _ = vl_family
    rendered, _ = image_prompt(processor, seed=4)
    text_ids = processor.tokenizer.encode("Reverse the text: hello")
    sampling = SamplingSettings(temperature=1.0, max_tokens=6, seed=2)
    with serving(path) as (engine, server):
        remote = RemoteEngine(base_url=server.url, model_name="tiny")
        remote.setup(path)
        assert remote.samples_images
        image_group, text_group = remote.generate(
            [rendered.prompt_ids, text_ids], 3, sampling, vision=[rendered.vision, None]
        )
        generator = torch.Generator().manual_seed(2 * 100_003)  # RemoteEngine's seed for the batch's first prompt
        request = GroupRequest(None, rendered.prompt_ids, 3, vision=rendered.vision)
        with torch.no_grad():
            direct = sample_image_group(engine, request, sampling, generator)
        stream = remote.open_stream(sampling, max_rows=8)  # InterruptingStream: streamed requests
        assert stream.takes_images
        stream.submit(GroupRequest("g", rendered.prompt_ids, 3, 7, vision=rendered.vision))
        streamed = drain(stream)["g"]
        stream.close()
        bad = post(
            server.url, "/completions", {"model": "tiny", "prompt": text_ids, "vision": to_base64(rendered.vision)}
        )
        continued = [rendered.prompt_ids, rendered.prompt_ids + image_group[0].token_ids[:2]]  # a cut group's rows
        vision = to_base64(rendered.vision)
        body = {"model": "tiny", "prompt": continued, "max_tokens": 2, "vision": vision, "return_token_ids": True}
        both = post(server.url, "/completions", body)
        alien = VisionInputs({"input_ids": torch.zeros(2, 3)}, {"input_ids": 0})
        named = post(server.url, "/completions", {"model": "tiny", "prompt": text_ids, "vision": to_base64(alien)})
        (blind,) = remote.generate([rendered.prompt_ids], 3, sampling)  # the same ids without their images
        blind_error = trainer_error(engine.model, rendered.prompt_ids, rendered.vision, blind, 1.0)
        whole = trainer_error(engine.model, rendered.prompt_ids, rendered.vision, image_group, 1.0)
        streamed_error = trainer_error(engine.model, rendered.prompt_ids, rendered.vision, streamed, 1.0)
    print(f"{family}: RemoteEngine token_mult_prob_error whole batch {whole:.9f}, streamed {streamed_error:.9f}, "
          f"without the images {blind_error:.6f}")  # fmt: skip
    assert [c.token_ids for c in image_group] == [c.token_ids for c in direct]
    for served, own in zip(image_group, direct):
        assert served.logprobs == pytest.approx(own.logprobs, abs=1e-6)
    assert abs(whole - 1) < 1e-4 and abs(streamed_error - 1) < 1e-4
    assert abs(blind_error - 1) > 1e-3, blind_error  # the check would see a server that dropped the images
    assert [c.token_ids for c in streamed] != [c.token_ids for c in image_group]  # its own seed
    assert len(text_group) == 3 and all(c.token_ids for c in text_group)
    assert both[0] == 200 and [len(c["token_ids"]) > 0 for c in both[1]["choices"]] == [True, True], both
    assert bad[0] == 400 and bad[1]["error"]["param"] == "vision", bad  # no image placeholders for the inputs
    assert named[0] == 400 and "the model takes image inputs" in named[1]["error"]["message"], named


def test_three_roles_train_on_image_prompts_through_grpokit_infer(tmp_path):
    """`grpokit infer` serving the tiny Qwen2.5-VL, `grpokit orchestrate` with RemoteEngine in front of it
    and `grpokit train`: 2 steps of the shapes environment at max_async_level 0, each token-faithful (the
    server sampled with the image inputs the trainer scores with)."""
    from grpokit.testing import build_tiny_qwen2_5_vl, free_port
    from tests.integration.test_three_roles import stop, three_roles, wait_ok
    from tests.support import read_metrics

    path = str(build_tiny_qwen2_5_vl(tmp_path / "qwen"))
    env = [{"id": "shapes", "args": {"num_tasks": 16}}]
    extra = ["--data.env", json.dumps(env), "--data.max_async_level", "0", "--data.seq_len", "256"]
    with three_roles(tmp_path, path, free_port(), 2, extra) as procs:
        wait_ok(procs, tmp_path)
        stop(procs, tmp_path)
    rows = read_metrics(tmp_path / "mp")
    errors = [float(r["token_mult_prob_error"]) for r in rows]
    print(f"three roles on image prompts: token_mult_prob_error {errors}")
    assert [int(r["step"]) for r in rows] == [0, 1]
    assert all(abs(e - 1) < 1e-4 for e in errors), errors
    samples = [json.loads(line) for line in open(tmp_path / "mp" / "samples.jsonl")]
    assert {s["env"] for s in samples} == {"shapes"}
