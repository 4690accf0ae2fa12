"""The vLLM worker extension's receiving side without vLLM: NCCLWeightReceiver's methods on a plain
object join a real 2-rank gloo NCCLBroadcast group, write received LoRA adapters as peft folders
(bit-identical, old ones pruned), and join the next group after the trainer goes away. Loading full
weights into vLLM's model is tested against the real CPU vLLM in tests/integration/test_vllm_cpu.py."""

import json
import threading
import time

import torch
from safetensors.torch import load_file

from grpokit.broadcast.nccl import NCCLBroadcast
from grpokit.common.checksums import tensors_sha256
from grpokit.inference.vllm.worker import KEEP_ADAPTERS, NCCLWeightReceiver
from grpokit.testing import free_port
from grpokit.types import WeightUpdate

CONFIG = {"r": 2, "lora_alpha": 4, "target_modules": ["q_proj"], "peft_type": "LORA"}


def adapter(step: int) -> WeightUpdate:
    g = torch.Generator().manual_seed(step)
    tensors = {
        "base_model.model.q_proj.lora_A.weight": torch.randn(2, 8, generator=g),
        "base_model.model.q_proj.lora_B.weight": torch.randn(8, 2, generator=g),
    }
    return WeightUpdate(step=step, tensors=tensors, lora_config=CONFIG)


def apply_when_received(worker, after_step: int) -> dict:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        result = worker.grpokit_apply(str(after_step))
        if result["step"] is not None:
            return result
        time.sleep(0.02)
    raise AssertionError("nothing received within 30 s")


def test_worker_writes_received_adapters_and_rejoins_after_the_trainer_goes(tmp_path):
    port = free_port()
    worker = NCCLWeightReceiver()  # the mixin alone: joining and writing adapters needs nothing of vLLM's
    settings = json.dumps({"port": port, "backend": "gloo", "timeout": 30.0, "adapter_dir": str(tmp_path / "adapters")})
    assert worker.grpokit_join(settings) == {"joined": True, "adapter_dir": str(tmp_path / "adapters")}
    trainer = NCCLBroadcast(port=port, backend="gloo", timeout=30.0)
    for step in range(1, KEEP_ADAPTERS + 3):
        sent = adapter(step)
        thread = threading.Thread(target=trainer.publish, args=(sent,))
        thread.start()
        result = apply_when_received(worker, step - 1)
        thread.join()
        assert (result["step"], result["lora_config"], result["sha256"]) == (step, CONFIG, tensors_sha256(sent.tensors))
        written = load_file(f"{result['lora_path']}/adapter_model.safetensors")
        assert tensors_sha256(written) == tensors_sha256(sent.tensors)  # bit-identical on the server's disk
        assert json.loads(open(f"{result['lora_path']}/adapter_config.json").read()) == CONFIG
    kept = sorted(p.name for p in (tmp_path / "adapters").iterdir())
    assert kept == [f"step_{s}" for s in range(3, KEEP_ADAPTERS + 3)]
    assert worker.grpokit_join(settings)["joined"]  # still receiving: the same receiver

    trainer.close()  # the trainer went away (run over, or killed and resumed)
    deadline = time.monotonic() + 10
    while worker.grpokit_apply("99") != {"step": None, "receiving": False}:
        assert time.monotonic() < deadline, "the worker did not notice the trainer leaving"
        time.sleep(0.05)
    worker.grpokit_join(settings)  # joins the restarted trainer's new group
    restarted = NCCLBroadcast(port=port, backend="gloo", timeout=30.0)
    thread = threading.Thread(target=restarted.publish, args=(adapter(7),))
    thread.start()
    assert apply_when_received(worker, 6)["step"] == 7
    thread.join()
    restarted.close()
