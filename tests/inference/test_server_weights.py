"""GET /v1/weights: the server loads the newest published step before answering, and its checksum of the
weights it holds equals the trainer's; a step with a truncated file (full weights or a LoRA adapter) is
logged naming the file while the server serves on; RemoteEngine's served_weight_step is the minimum over
its servers; the orchestrator learns the trainer's progress from the servers when only they may poll the
broadcast."""

from __future__ import annotations

import http.server
import json
import threading
import urllib.error
import urllib.request
from contextlib import ExitStack
from functools import partial

import pytest
import torch

from grpokit.broadcast.filesystem import FilesystemBroadcast
from grpokit.broadcast.ipc import IPCBroadcast
from grpokit.broadcast.nccl import NCCLBroadcast
from grpokit.common.checksums import tensors_sha256
from grpokit.common.models import load_causal_lm, load_tokenizer
from grpokit.common.run_context import RunContext
from grpokit.environments.environment import EnvSpec
from grpokit.inference.builtin import BuiltinEngine
from grpokit.inference.remote import RemoteEngine, RemoteError
from grpokit.orchestrator import Orchestrator
from grpokit.orchestrator.weights import ServedWeights, weight_source
from grpokit.types import WeightUpdate
from tests.support import serving


def get(url: str, data: bytes | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def post(url: str, body: dict) -> tuple[int, dict]:
    status, answer = get(url, json.dumps(body).encode())
    for key in ("id", "created"):  # differ between identical answers
        answer.pop(key, None)
    return status, answer


def lora_update(tiny_model: str, step: int) -> WeightUpdate:
    """A LoRA update as Policy.weight_update makes it (peft names, the config as a dict), with random B."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

    model = get_peft_model(
        load_causal_lm(tiny_model), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    )
    g = torch.Generator().manual_seed(step)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.data.copy_(torch.randn(p.shape, generator=g))
    config = json.loads(
        json.dumps(
            model.peft_config["default"].to_dict(), default=lambda o: sorted(o) if isinstance(o, set) else str(o)
        )
    )
    return WeightUpdate(
        step=step,
        tensors={k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()},
        lora_config=config,
    )


def test_weights_endpoint_loads_the_newest_step_first_and_its_checksum_is_the_trainers(tiny_model, tmp_path):
    trainer, reader = FilesystemBroadcast(), FilesystemBroadcast()
    trainer.setup(tmp_path)
    reader.setup(tmp_path)
    with serving(tiny_model, reader) as (engine, server):
        assert get(server.url + "/weights") == (200, {"object": "weights", "weight_step": -1})
        update = lora_update(tiny_model, step=2)
        trainer.publish(update)
        status, answer = get(server.url + "/weights?sha256=true")
        assert status == 200 and answer["weight_step"] == 2 == engine.weight_step  # loaded before answering
        assert answer["sha256"] == tensors_sha256(update.tensors)


def full_update(engine, step: int) -> WeightUpdate:
    """A full-weights update: the engine's own weights."""
    return WeightUpdate(step=step, tensors={k: v.clone() for k, v in engine.model.state_dict().items()})


@pytest.mark.parametrize(
    ("kind", "file"), [("full", "model.safetensors"), ("lora", "adapter_model.safetensors")], ids=["full", "lora"]
)
def test_a_truncated_step_is_logged_with_its_path_and_the_server_serves_on(tiny_model, tmp_path, caplog, kind, file):
    """Step 1 loads; step 2's weights file (model.safetensors, or a LoRA adapter's adapter_model.safetensors)
    is cut short after STABLE: answers come from the weights the engine holds (the same tokens, weight_step
    1), the log names the file once, GET /v1/weights answers a 500 naming it, and the next good step loads."""
    trainer, reader = FilesystemBroadcast(), FilesystemBroadcast()
    trainer.setup(tmp_path)
    reader.setup(tmp_path)
    body = {"prompt": [1, 520, 9531, 198], "max_tokens": 4, "temperature": 0}
    with serving(tiny_model, reader) as (engine, server):
        update = (lambda step: full_update(engine, step)) if kind == "full" else partial(lora_update, tiny_model)
        trainer.publish(update(1))
        held = post(server.url + "/completions", body)
        assert held[0] == 200 and held[1]["weight_step"] == 1 == engine.weight_step
        trainer.publish(update(2))
        (weights,) = tmp_path.rglob("step_2/*.safetensors")
        assert weights.name == file
        weights.write_bytes(weights.read_bytes()[:100])
        with caplog.at_level("ERROR", logger="grpokit.inference.server.generation"):
            answers = [post(server.url + "/completions", body) for _ in range(2)]
        assert answers == [held, held]  # the weights of step 1, still
        (record,) = [r for r in caplog.records if "cut short or corrupt" in r.getMessage()]
        assert str(weights) in record.getMessage() and "serving on with the weights of step 1" in record.getMessage()
        status, answer = get(server.url + "/weights")
        message = answer["error"]["message"]
        assert status == 500 and str(weights) in message and "(the engine holds step 1)" in message, answer
        trainer.publish(update(3))
        status, answer = post(server.url + "/completions", body)
        assert status == 200 and answer["weight_step"] == 3 == engine.weight_step


def test_weights_endpoint_refusals(tiny_model):
    with serving(tiny_model, None) as (_, server):
        status, answer = get(server.url + "/weights?sha256=yes")
        assert status == 400 and answer["error"]["param"] == "sha256"
        request = urllib.request.Request(server.url + "/weights", data=b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(request, timeout=60)
        assert e.value.code == 405


def test_served_weight_step_is_the_oldest_of_the_servers(tiny_model, tmp_path):
    with ExitStack() as stack:
        urls = []
        for step in (3, 1):
            trainer, reader = FilesystemBroadcast(), FilesystemBroadcast()
            trainer.setup(tmp_path / str(step))
            reader.setup(tmp_path / str(step))
            trainer.publish(lora_update(tiny_model, step))
            urls.append(stack.enter_context(serving(tiny_model, reader))[1].url)
        remote = RemoteEngine(base_url=urls, model_name="tiny")
        remote.setup(tiny_model)
        assert remote.served_weight_step() == 1
        source = ServedWeights(remote)
        update = source.poll(0)
        assert update.step == 1 and update.in_engine and update.tensors == {}
        assert source.poll(1) is None


class NotGrpokit(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # an OpenAI server without grpokit's /v1/weights (vLLM, say)
        self.send_error(404)

    def log_message(self, *args) -> None:
        pass


def test_a_server_without_the_weights_endpoint_is_named():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotGrpokit)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        remote = RemoteEngine(base_url=f"http://127.0.0.1:{server.server_address[1]}/v1", max_retries=0)
        remote.setup("unused")
        with pytest.raises(RemoteError, match=r"has no /v1/weights.*grpokit infer.*FilesystemBroadcast"):
            remote.served_weight_step()
    finally:
        server.shutdown()
        server.server_close()


def test_the_orchestrator_polls_the_broadcast_only_where_it_may():
    remote, two = RemoteEngine(), RemoteEngine(base_url=["http://a/v1", "http://b/v1"])
    local = BuiltinEngine(device="cpu")
    fs, nccl, ipc = FilesystemBroadcast(), NCCLBroadcast(backend="gloo"), IPCBroadcast()
    assert weight_source(remote, fs) is fs  # anyone may poll the filesystem
    assert weight_source(local, nccl) is nccl  # the orchestrator's process is the engine's (fit)
    assert isinstance(weight_source(remote, nccl), ServedWeights)
    assert isinstance(weight_source(two, ipc), ServedWeights)  # several servers map the same segments
    with pytest.raises(
        ValueError, match=r"NCCLBroadcast reaches 1 engine.*inference.init_args.base_url lists 2 servers"
    ):
        weight_source(two, nccl)
    assert nccl.rank is None  # nothing joined


def test_orchestrator_waits_for_the_servers_weights(tiny_model, tmp_path):
    """IPC as in `grpokit infer | orchestrate | train`: the server maps the trainer's segments, the
    orchestrator asks the server; a timeout names the server."""
    trainer, reader, never = IPCBroadcast(), IPCBroadcast(), IPCBroadcast()
    for b in (trainer, reader, never):
        b.setup(tmp_path)
    never.poll = None  # the orchestrator's broadcast: calling poll on it would fail the test
    with serving(tiny_model, reader) as (engine, server):
        remote = RemoteEngine(base_url=server.url, model_name="tiny")
        remote.setup(tiny_model)
        data = Orchestrator(
            env=[EnvSpec(id="reverse-text", args={"num_tasks": 4})], batch_size=8, rollouts_per_example=4, timeout=0.5
        )
        data.connect(remote, never, load_tokenizer(tiny_model), RunContext(tmp_path, run_name_given=True), max_steps=2)
        with pytest.raises(
            TimeoutError,
            match=r"no weights of step >= 0 .*\(IPCBroadcast\) to the server \(`grpokit infer`.*holds step -1\)\?",
        ):
            data.loop.wait_for_weights(0)
        trainer.publish(lora_update(tiny_model, step=0))
        data.loop.wait_for_weights(0)
        assert remote.weight_step == 0 == engine.weight_step
    trainer.close()


def test_an_orchestrator_refuses_a_server_of_another_run(tiny_model):
    """An orchestrator pointed at a server left running for another run used to sample with that run's
    weights: trained on silently at a lower step, refused as "the trainer restarted" at a higher one.
    `grpokit infer` names its run in GET /v1/weights; RemoteEngine checks it before its first request."""
    from grpokit.common.errors import RunDataError
    from grpokit.inference import SamplingSettings

    with serving(tiny_model, None) as (_, server):
        server.app.run_name = "mpt"
        assert get(server.url + "/weights")[1]["run"] == "mpt"
        for run_name in ("mpt", None):  # its own run, or a client that names none (a script, a test)
            remote = RemoteEngine(base_url=server.url, model_name="tiny", max_retries=0)
            remote.run_name = run_name
            remote.setup(tiny_model)
            assert len(remote.generate([[1, 2, 3]], 1, SamplingSettings(max_tokens=2))[0]) == 1
        remote = RemoteEngine(base_url=server.url, model_name="tiny", max_retries=0)
        remote.run_name = "mpx"
        remote.setup(tiny_model)
        with pytest.raises(
            RunDataError,
            match=r"serves run 'mpt', this orchestrator's run is 'mpx': start `grpokit infer` with --run_name mpx",
        ):
            remote.generate([[1, 2, 3]], 1, SamplingSettings(max_tokens=2))


def test_max_weight_step_loads_the_newest_step_up_to_it_and_refuses_a_server_ahead(tiny_model, tmp_path):
    """data.deterministic: a request's `max_weight_step` (and GET /v1/weights?max_weight_step=N) loads the
    newest published step up to N though newer ones are published; a server already holding a newer step
    answers 409 naming both (it cannot sample with the scheduled weights any more)."""
    trainer, reader = FilesystemBroadcast(keep_last=10), FilesystemBroadcast()
    trainer.setup(tmp_path)
    reader.setup(tmp_path)
    body = {"prompt": [1, 520, 9531, 198], "max_tokens": 4, "temperature": 0}
    with serving(tiny_model, reader) as (engine, server):
        for step in (1, 2, 3):
            trainer.publish(lora_update(tiny_model, step))
        status, answer = post(server.url + "/completions", {**body, "max_weight_step": 1})
        assert status == 200 and answer["weight_step"] == 1 == engine.weight_step
        assert get(server.url + "/weights?max_weight_step=2")[1]["weight_step"] == 2
        status, answer = post(server.url + "/completions", {**body, "max_weight_step": 1})
        assert status == 409 and answer["error"]["param"] == "max_weight_step", answer
        assert "already holds the weights of step 2" in answer["error"]["message"]
        assert get(server.url + "/weights?max_weight_step=x")[0] == 400
        assert post(server.url + "/completions", {**body, "max_weight_step": -1})[0] == 400
        status, answer = post(server.url + "/completions", body)  # no bound: the newest
        assert status == 200 and answer["weight_step"] == 3
