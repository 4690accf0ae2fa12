"""A multi-turn environment whose first prompt holds a picture (shapes with `tries: 2`: a wrong answer is
told "No, look again." and asked again): every turn is sampled with the picture and the trainer scores the
whole conversation with it (token-faithful at max_async_level 0, tiny Qwen2.5-VL); an environment turn with a
part that is neither text nor an image is refused, naming the example (a later turn's pictures:
tests/vision/test_later_turn_images.py)."""

from __future__ import annotations

import json

import pytest

from grpokit.environments import EnvTurn
from grpokit.envs.shapes import ShapesRetryTask
from grpokit.main import main
from grpokit.testing import build_tiny_qwen2_5_vl, tiny_fit_argv
from grpokit.vision.images import to_data_url
from tests.support import read_metrics
from tests.vision.pictures import striped


def retry_argv(tmp_path, model: str, name: str) -> list[str]:
    """Common letters end a reply (stop strings), so most of the random model's replies stop within a few
    tokens (a reply cut at max_tokens ends its conversation before the environment's turn)."""
    env = [{"id": "shapes", "args": {"num_tasks": 16, "tries": 2}}]
    return tiny_fit_argv(
        tmp_path, model, name, "--data.env", json.dumps(env), "--data.eval", "null",
        "--data.max_async_level", "0", "--data.seq_len", "512", "--trainer.max_steps", "2",
        "--data.sampling.stop", json.dumps(list("aeiou nrst")),
    )  # fmt: skip


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    return str(build_tiny_qwen2_5_vl(tmp_path_factory.mktemp("qwen")))


def test_a_second_turn_is_sampled_and_trained_with_the_first_prompts_picture(qwen, tmp_path):
    assert main(retry_argv(tmp_path, qwen, "retry")) == 0
    rows = read_metrics(tmp_path / "retry")
    assert [int(r["step"]) for r in rows] == [0, 1]
    for r in rows:
        assert abs(float(r["token_mult_prob_error"]) - 1) < 1e-4, r
    samples = [json.loads(line) for line in open(tmp_path / "retry" / "samples.jsonl")]
    # the random model never names the colour: a reply that stopped got the environment's turn and a second
    second = [s for s in samples if "No, look again." in s["completion"]]
    assert len(second) >= len(samples) // 2, samples[:4]


def test_an_environment_turn_with_a_part_that_is_not_text_or_an_image_is_refused_naming_the_example(
    qwen, tmp_path, monkeypatch
):
    picture = {"type": "image_url", "image_url": {"url": to_data_url(striped(8, 8, 1))}}
    sound = {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}

    def respond(self, messages, state):
        return EnvTurn([{"role": "user", "content": [picture, sound, {"type": "text", "text": "And this one?"}]}])

    monkeypatch.setattr(ShapesRetryTask, "respond", respond)
    with pytest.raises(RuntimeError, match=r"environment 'shapes' example \d+: content part of type 'input_audio'"):
        main(retry_argv(tmp_path, qwen, "later"))
