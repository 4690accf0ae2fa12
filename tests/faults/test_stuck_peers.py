"""A stuck peer is detected by a timeout with an error naming the peer and the setting, never a silent hang.

Where each role waits, and the setting that bounds it:
- the trainer, for the next batch: data.timeout (here);
- the orchestrator, for the trainer's weights: data.timeout (here);
- the orchestrator, for the inference server's answer: inference.init_args.timeout per try, with
  max_retries tries (here, against a server that accepts and never answers);
- the orchestrator, for room in a full ZMQ queue: data.transport.init_args.send_timeout
  (tests/transport/test_zmq.py::test_full_queue_blocks_send_then_times_out);
- the trainer and engine, for each other over NCCL: broadcast.init_args.timeout (grpokit/broadcast/nccl.py).
"""

import time

import pytest

from grpokit.broadcast.filesystem import FilesystemBroadcast
from grpokit.common.models import load_tokenizer
from grpokit.common.run_context import RunContext
from grpokit.environments.environment import EnvSpec
from grpokit.inference import SamplingSettings
from grpokit.inference.remote import RemoteEngine
from grpokit.orchestrator import Orchestrator
from tests.support import ScriptedServer


def test_trainer_waiting_for_a_batch_names_the_orchestrator_and_data_timeout(tmp_path):
    data = Orchestrator(batch_size=8, rollouts_per_example=4, timeout=0.5)
    data.connect_trainer(tmp_path, max_steps=2)
    start = time.monotonic()
    with pytest.raises(
        TimeoutError,
        match=r"no batch for step 0 after 0s \(data.timeout\): the orchestrator .* sent none.*rollouts/step_0",
    ):
        data.receive(0)
    assert time.monotonic() - start < 5


def test_orchestrator_waiting_for_weights_names_the_trainer_and_data_timeout(tmp_path, tiny_model):
    data = Orchestrator(
        env=[EnvSpec(id="reverse-text", args={"num_tasks": 4})], batch_size=8, rollouts_per_example=4, timeout=0.3
    )
    broadcast = FilesystemBroadcast()
    broadcast.setup(tmp_path)  # nothing published: the trainer never started
    data.connect(
        RemoteEngine(), broadcast, load_tokenizer(tiny_model), RunContext(tmp_path, run_name_given=True), max_steps=2
    )
    with pytest.raises(
        TimeoutError,
        match=r"no weights of step >= 0 after 0s \(data.timeout\): is the "
        r"trainer \(`grpokit train`\) running .*FilesystemBroadcast",
    ):
        data.loop.wait_for_weights(0)


def test_the_wait_for_weights_has_a_timeout_of_its_own(tmp_path, tiny_model):
    """data.weights_timeout bounds the orchestrator's wait apart from data.timeout (the trainer's wait for
    a batch, which may need to be long while an engine samples a large step)."""
    data = Orchestrator(
        env=[EnvSpec(id="reverse-text", args={"num_tasks": 4})],
        batch_size=8,
        rollouts_per_example=4,
        timeout=1000.0,
        weights_timeout=0.3,
    )
    broadcast = FilesystemBroadcast()
    broadcast.setup(tmp_path)
    data.connect(
        RemoteEngine(), broadcast, load_tokenizer(tiny_model), RunContext(tmp_path, run_name_given=True), max_steps=2
    )
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"no weights of step >= 0 after 0s \(data.weights_timeout\)"):
        data.loop.wait_for_weights(0)
    assert time.monotonic() - start < 5


def test_a_server_that_never_answers_is_reported_after_timeout_and_retries():
    with ScriptedServer(["hang"]) as server:
        remote = RemoteEngine(base_url=server.url, timeout=0.3, max_retries=1)
        remote.setup("unused")
        start = time.monotonic()
        with pytest.raises(
            ConnectionError, match=r"failed 2 tries \((TimeoutError|timeout)\b.*inference.init_args.timeout \(0.3s\)"
        ):
            remote.generate([[1, 2]], 1, SamplingSettings(max_tokens=4))
        assert time.monotonic() - start < 5 and len(server.request_times) == 2
