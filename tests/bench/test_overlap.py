"""grpokit.bench.overlap: the async bound between a generating thread and the training loop."""

from __future__ import annotations

import threading
import time

import pytest

from grpokit.bench.overlap import AsyncBound, overlapped


def scripted_generator(batches: int, starts: list[tuple[int, int]], seconds: float = 0.0):
    """A generator of `batches` batches that records (batch, trained steps) as each batch starts."""

    def generate(bound: AsyncBound) -> None:
        for n in range(batches):
            bound.wait_to_start(n)
            starts.append((n, bound.trained))
            time.sleep(seconds)
            bound.batch_done()

    return generate


@pytest.mark.parametrize("level", [0, 1, 2])
def test_a_batch_starts_only_with_weights_at_most_level_steps_old(level):
    starts: list[tuple[int, int]] = []
    trained_at: list[int] = []
    lock = threading.Lock()

    def train():
        with lock:
            trained_at.append(len(starts))  # batches started before this optimizer step ended
        time.sleep(0.02)

    result = overlapped(scripted_generator(6, starts, 0.005), train, 6, "cpu", level)
    assert [n for n, _ in starts] == list(range(6))
    for n, trained in starts:
        assert trained >= n - level  # the bound
    # the bound is also not stricter than it must be: training is slower, so the generator runs ahead
    # as far as it may, and batch n starts as soon as step n - level has trained
    assert any(trained == n - level for n, trained in starts[level + 1 :])
    assert result["overlapped_total_s"] >= 5 * 0.02 and result["overlapped_step_s"] >= 0.02


def test_without_a_trainer_the_bound_never_waits():
    bound = AsyncBound(None)
    assert all(bound.may_start(n) for n in range(100))
    bound.wait_to_start(99)  # returns at once


def test_a_generator_error_reaches_the_training_thread():
    def generate(bound: AsyncBound) -> None:
        bound.batch_done()
        raise ValueError("engine broke")

    with pytest.raises(ValueError, match="engine broke"):
        overlapped(generate, lambda: time.sleep(0.01), 3, "cpu")
