"""grpokit.common.graph_capture: a CUDA graph capture and a training step never overlap in one process."""

from __future__ import annotations

import threading
import time

import torch

from grpokit.common.graph_capture import capture_lock


def test_on_cuda_a_second_holder_waits_for_the_first():
    # the lock is a host-side lock: no GPU is needed to check that it serializes (device strings only)
    order: list[str] = []
    held = threading.Event()

    def trainer_step():
        with capture_lock("cuda:0"):
            held.set()
            time.sleep(0.05)
            order.append("step ends")

    thread = threading.Thread(target=trainer_step)
    thread.start()
    held.wait()
    with capture_lock(torch.device("cuda")):  # the engine's capture
        order.append("capture")
    thread.join()
    assert order == ["step ends", "capture"]


def test_on_a_cpu_nothing_waits():
    with capture_lock("cpu"), capture_lock(torch.device("cpu")):  # would deadlock if it took the lock
        pass
