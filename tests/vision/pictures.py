"""Deterministic test images for tests/vision."""

from __future__ import annotations

from PIL import Image


def striped(width: int, height: int, seed: int) -> Image.Image:
    """A deterministic RGB test image with structure (so patches differ): stripes coloured by `seed`."""
    image = Image.new("RGB", (width, height))
    image.putdata(
        [
            ((x * 37 + seed * 11) % 256, (y * 53 + seed * 29) % 256, ((x + y) * 7 + seed) % 256)
            for y in range(height)
            for x in range(width)
        ]
    )
    return image
