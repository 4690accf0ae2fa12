"""grpokit.vision.images: every source form decodes to the same RGB image; the pixel budget; errors."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from grpokit.vision.images import ImageError, PixelBudget, load_image, to_data_url
from tests.vision.pictures import striped


def test_path_bytes_pil_and_data_url_load_equal(tmp_path):
    original = striped(30, 20, seed=1)
    path = tmp_path / "a.png"
    original.save(path)
    buffer = io.BytesIO()
    original.save(buffer, format="PNG")
    loaded = [load_image(s) for s in (str(path), path, buffer.getvalue(), original, to_data_url(original))]
    assert all(image.mode == "RGB" and image.size == (30, 20) for image in loaded)
    assert all(image.tobytes() == original.tobytes() for image in loaded)


def test_a_palette_or_alpha_image_becomes_rgb():
    rgba = Image.new("RGBA", (4, 4), (10, 20, 30, 128))
    assert load_image(rgba).mode == "RGB"
    assert load_image(rgba.convert("P")).mode == "RGB"


def test_an_image_over_budget_is_resized_within_it_keeping_its_aspect_ratio():
    image = load_image(striped(300, 100, seed=2), PixelBudget(max_pixels=3000))
    width, height = image.size
    assert width * height <= 3000
    assert (width, height) == (94, 31)  # sqrt(3000 / 30000) = 0.316: 300 -> 94, 100 -> 31
    assert load_image(striped(30, 10, seed=2), PixelBudget(max_pixels=3000)).size == (30, 10)  # within: kept


def test_an_image_over_budget_is_refused_when_the_setting_says_so():
    with pytest.raises(ImageError, match=r"300x100 = 30000 pixels is over the budget of 3000") as caught:
        load_image(striped(300, 100, seed=2), PixelBudget(3000, over_budget="refuse"), label="shapes/example 7")
    assert caught.value.label == "shapes/example 7"
    assert str(caught.value).startswith("shapes/example 7: ")
    assert isinstance(caught.value, ValueError)


def test_a_missing_file_error_names_the_file_and_the_example(tmp_path):
    missing = tmp_path / "nowhere" / "cat.png"
    with pytest.raises(ImageError, match=r"image file '.*nowhere/cat\.png' does not exist") as caught:
        load_image(str(missing), label="env x/example 3")
    assert str(caught.value).startswith("env x/example 3: ")


def test_unreadable_bytes_files_and_data_urls_are_named(tmp_path):
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not an image")
    with pytest.raises(ImageError, match=r"bad\.png' is unreadable"):
        load_image(bad)
    with pytest.raises(ImageError, match=r"<3 bytes> is unreadable"):
        load_image(b"abc")
    with pytest.raises(ImageError, match="not base64"):
        load_image("data:image/png,abc")
    with pytest.raises(ImageError, match="bad base64 payload"):
        load_image("data:image/png;base64,@@@")
    with pytest.raises(ImageError, match="is not fetched"):
        load_image("https://example.com/cat.png")


def test_a_bad_budget_is_refused():
    with pytest.raises(ValueError, match="max_pixels"):
        PixelBudget(max_pixels=0)
    with pytest.raises(ValueError, match="over_budget"):
        PixelBudget(100, over_budget="crop")
