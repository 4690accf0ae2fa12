"""Every broadcast carries QeRL's noisy norm weights with the update, bit-identical, apart from the adapter."""

import socket
import threading

import torch
from safetensors.torch import load_file

from grpokit.broadcast.filesystem import ADAPTER_FILE, NORMS_FILE, FilesystemBroadcast
from grpokit.broadcast.ipc import IPCBroadcast
from grpokit.broadcast.nccl import NCCLBroadcast
from grpokit.types import NORMS_PREFIX, WeightUpdate

LORA_CONFIG = {"r": 4, "peft_type": "LORA"}


def make_update(step: int) -> WeightUpdate:
    g = torch.Generator().manual_seed(step)
    adapter = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.randn(4, 64, generator=g)}
    norms = {
        "model.layers.0.input_layernorm.weight": 1 + 1e-2 * torch.randn(64, generator=g),
        "model.layers.0.self_attn.q_norm.weight": (1 + 1e-2 * torch.randn(32, generator=g)).to(torch.bfloat16),
        "model.norm.weight": 1 + 1e-2 * torch.randn(64, generator=g),
    }
    return WeightUpdate(step=step, tensors=adapter, lora_config=LORA_CONFIG, norm_tensors=norms)


def assert_same(got: WeightUpdate, sent: WeightUpdate) -> None:
    assert got.step == sent.step and got.lora_config == sent.lora_config
    assert list(got.tensors) == list(sent.tensors) and set(got.norm_tensors) == set(sent.norm_tensors)
    for part in ("tensors", "norm_tensors"):
        for name, t in getattr(sent, part).items():
            u = getattr(got, part)[name]
            assert u.dtype == t.dtype and torch.equal(u, t), f"{part}[{name}]"


def test_wire_round_trip_keeps_norms_apart():
    u = make_update(1)
    wire = u.wire_tensors()
    assert sum(k.startswith(NORMS_PREFIX) for k in wire) == 3
    assert_same(WeightUpdate.from_wire(1, wire, LORA_CONFIG), u)
    plain = WeightUpdate(step=2, tensors={"w": torch.ones(2)})
    assert WeightUpdate.from_wire(2, plain.wire_tensors()).norm_tensors == {}


def test_filesystem_saves_the_norms_beside_the_adapter(tmp_path):
    b = FilesystemBroadcast()
    b.setup(tmp_path)
    b.publish(make_update(3))
    step_dir = tmp_path / "broadcasts" / "step_3"
    assert set(load_file(step_dir / ADAPTER_FILE)) == set(
        make_update(3).tensors
    )  # the adapter stays a plain peft adapter
    assert set(load_file(step_dir / NORMS_FILE)) == set(make_update(3).norm_tensors)
    assert_same(b.poll(-1), make_update(3))
    b.publish(WeightUpdate(step=4, tensors=make_update(4).tensors, lora_config=LORA_CONFIG))  # no noise: no norms file
    assert not (tmp_path / "broadcasts" / "step_4" / NORMS_FILE).exists() and b.poll(3).norm_tensors == {}


def test_ipc_carries_the_norms(tmp_path):
    b = IPCBroadcast()
    b.setup(tmp_path)
    try:
        b.publish(make_update(5))
        assert_same(b.poll(-1), make_update(5))
    finally:
        b.close()


def test_nccl_over_gloo_carries_the_norms():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    trainer, engine = (
        NCCLBroadcast(port=port, backend="gloo", timeout=30),
        NCCLBroadcast(port=port, backend="gloo", timeout=30),
    )
    publisher = threading.Thread(target=trainer.publish, args=(make_update(6),))
    publisher.start()
    try:
        got = None
        for _ in range(3000):
            got = engine.poll(-1)
            if got is not None:
                break
            threading.Event().wait(0.01)
        publisher.join(timeout=30)
        assert got is not None, "the engine never received the update"
        assert_same(got, make_update(6))
    finally:
        trainer.close()
        engine.close()
