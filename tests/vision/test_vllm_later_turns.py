"""VLLMEngine plays a conversation whose later turn brings a picture (`respond`'s) against a stand-in for vLLM
0.32's token-in route that expands each image placeholder with the tiny model's own processor, as vLLM does:
the second turn's request holds the whole conversation's ids before expansion (the first prompt, the reply,
the turn) and both pictures in order, and their expansion is grpokit's ids (VLLMEngine checks every answer).
The real server: tests/integration/test_vllm_images.py."""

from __future__ import annotations

import json

from grpokit.environments.environment import Environment, EnvSpec
from grpokit.envs.shapes import ShapesRetryTask
from grpokit.inference.vllm.engine import VLLMEngine
from grpokit.vision.images import PixelBudget, load_image
from grpokit.vision.messages import prompt_images
from grpokit.vision.render import render_prompt
from tests.support.servers import JsonStub, stub_server
from tests.vision.test_later_turn_images import respond_with_a_picture, two_turns

REPLIES = ["red", "blue", "green"]  # a group's first replies: of different lengths, so different pictures


def expanded(processor, ids: list[int], pictures: list) -> list[int]:
    """`ids` with each image placeholder replaced by the processor's expansion of its picture, in order."""
    token = str(processor.image_token)
    placeholder, pictures = processor.tokenizer.convert_tokens_to_ids(token), iter(pictures)
    out = []
    for t in ids:
        image = processor(text=[token], images=[next(pictures)], add_special_tokens=False) if t == placeholder else None
        out += [t] if image is None else list(image["input_ids"][0])
    return out


class ProcessorGenerate(JsonStub):
    """vLLM's generate route on the tiny model: the pictures loaded from the data URLs, the ids expanded by
    the processor, each choice a canned reply (REPLIES[index] + <|im_end|>, logprobs -1)."""

    processor = None
    calls: list[dict] = []

    def answer(self, path: str, body: dict) -> tuple[int, bytes]:
        if not body:
            return 400, b'{"error": {"message": "empty"}}'  # the route is there
        ProcessorGenerate.calls.append(body)
        tokenizer = self.processor.tokenizer
        pictures = [load_image(part["url"]) for part in body["content_parts"]]
        choices = []
        for i in range(body["sampling_params"]["n"]):
            reply = tokenizer.encode(REPLIES[i % 3], add_special_tokens=False) + [
                tokenizer.convert_tokens_to_ids("<|im_end|>")
            ]
            content = [{"token_id": t, "logprob": -1.0} for t in reply]
            choices.append({"index": i, "token_ids": reply, "finish_reason": "stop", "logprobs": {"content": content}})
        ids = expanded(self.processor, body["token_ids"], pictures)
        answer = {"model": body["model"], "prompt_token_ids": ids, "choices": choices}
        return 200, json.dumps(answer).encode()


def test_a_later_turn_sends_vllm_the_whole_conversation_and_every_picture(vl_family, monkeypatch):
    family, path, processor, _ = vl_family
    ProcessorGenerate.processor, ProcessorGenerate.calls = processor, []
    monkeypatch.setattr(ShapesRetryTask, "respond", respond_with_a_picture)
    env = Environment(EnvSpec("shapes", {"num_tasks": 2, "tries": 2}))
    with stub_server(ProcessorGenerate) as url:
        engine = VLLMEngine(base_url=url, model_name="base", max_retries=0)
        engine.setup(path)
        _, rollouts = two_turns(path, env, engine)
    shown = [r for r in rollouts if "Now this one:" in r.completion_text]
    assert len(shown) == len(rollouts) == 6  # every canned reply stops, and is shown a picture
    later = [c for c in ProcessorGenerate.calls if len(c["content_parts"]) == 2]
    assert len(later) == 6 and len(ProcessorGenerate.calls) == 8  # 2 groups' first turns, 6 second turns
    expected = []  # per rollout: its chat up to the picture turn, rendered at once (template ids, pictures)
    for r in shown:
        shaped, pictures = prompt_images(r.messages[:-1], PixelBudget(), "test")
        whole = render_prompt(processor, shaped, pictures, keep_source=True)
        assert whole.prompt_ids == (r.prompt_ids + r.completion_ids)[: len(whole.prompt_ids)]  # grpokit's ids
        expected.append((whole.vision.source.template_ids, [p.tobytes() for p in pictures]))
    sent = [(c["token_ids"], [load_image(p["url"]).tobytes() for p in c["content_parts"]]) for c in later]
    assert sorted(sent) == sorted(expected)  # each second turn: the whole conversation, both pictures in order
    assert len({pictures[1] for _, pictures in sent}) == 3  # each reply its own picture
    print(f"\n{family}: second-turn requests of {[len(ids) for ids, _ in sent]} ids before expansion, 2 pictures")
