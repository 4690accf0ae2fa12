"""grpokit.vision.messages: image parts of any turn, in order, in both part shapes."""

from __future__ import annotations

import pytest

from grpokit.vision.images import ImageError, to_data_url
from grpokit.vision.messages import prompt_images, split_images
from tests.vision.pictures import striped


def test_images_in_several_turns_come_out_in_prompt_order(tmp_path):
    first, second, third = striped(8, 8, 1), striped(9, 7, 2), striped(5, 6, 3)
    path = tmp_path / "third.png"
    third.save(path)
    messages = [
        {"role": "system", "content": "Look closely."},
        {"role": "user", "content": [{"type": "image", "image": first}, {"type": "text", "text": "and"}]},
        {"role": "assistant", "content": "Seen."},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": to_data_url(second)}},
                {"type": "text", "text": "then"},
                {"type": "image", "path": str(path)},
            ],
        },
    ]
    shaped, images = prompt_images(messages)
    assert [m["content"] for m in shaped] == [
        "Look closely.",
        [{"type": "image"}, {"type": "text", "text": "and"}],
        "Seen.",
        [{"type": "image"}, {"type": "text", "text": "then"}, {"type": "image"}],
    ]
    assert [i.tobytes() for i in images] == [first.tobytes(), second.tobytes(), third.tobytes()]
    assert messages[1]["content"][0]["image"] is first  # the input is not changed


def test_a_part_of_another_type_or_without_an_image_is_refused():
    with pytest.raises(ImageError, match="example 1: content part of type 'input_audio' is not supported"):
        split_images([{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}], label="example 1")
    with pytest.raises(ImageError, match="image_url part without a url"):
        split_images([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])
    with pytest.raises(ImageError, match="image part without an image"):
        split_images([{"role": "user", "content": [{"type": "image"}]}])


def test_more_images_than_the_model_takes_is_refused_naming_the_count():
    from grpokit.vision.images import PixelBudget

    two = [{"role": "user", "content": [{"type": "image", "image": striped(8, 8, 1)}] * 2}]
    with pytest.raises(ImageError, match=r"shapes example 4: 2 images, more than the model takes .*max_images 1"):
        prompt_images(two, PixelBudget(max_images=1), "shapes example 4")
    assert len(prompt_images(two, PixelBudget(max_images=2))[1]) == 2
    with pytest.raises(ValueError, match="max_images"):
        PixelBudget(max_images=0)
