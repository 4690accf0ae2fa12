"""grpokit.common.once: a key is first exactly once, even across threads."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from grpokit.common.once import Once


def test_a_key_is_first_once_and_keys_are_independent():
    once = Once()
    assert once.first("look") and not once.first("look")
    assert once.first("draw")


def test_among_racing_threads_exactly_one_is_first():
    once = Once()
    with ThreadPoolExecutor(8) as pool:
        firsts = list(pool.map(lambda _: once.first("look"), range(200)))
    assert firsts.count(True) == 1
