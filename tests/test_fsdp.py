"""grpokit.fsdp and the Policy's sharded paths, on a real 2-process gloo group: the weights a sharded
Policy publishes (full fine-tuning, a LoRA adapter, QeRL noisy norms) are bit-identical to the unsharded
Policy's, and full weights loaded into a sharded model land in every shard.

The test runs this file as a script, once per rank; each rank writes what it got to a JSON file.
(The whole `grpokit fit --trainer.strategy fsdp2` run is tests/integration/test_fsdp.py.)
"""

import json
import socket
import subprocess
import sys
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sharded_policy_publishes_what_the_unsharded_one_does(tmp_path, tiny_model):
    port = free_port()
    procs = [subprocess.Popen([sys.executable, __file__, str(rank), str(port), str(tmp_path), tiny_model]) for rank in range(2)]
    assert [p.wait(timeout=180) for p in procs] == [0, 0]
    got = [json.loads((tmp_path / f"rank_{rank}.json").read_text()) for rank in range(2)]
    reference, rank0, rank1 = got[0]["reference"], got[0]["sharded"], got[1]["sharded"]
    assert rank0 == reference  # full weights, adapter and noisy norms: the same bytes
    assert rank1["full"] == {"sha256": None, "count": 0}  # full weights are gathered onto rank 0 only
    assert rank1["lora"] == reference["lora"] and rank1["norms"] == reference["norms"]  # adapter and norms on every rank
    assert got[0]["loaded"] and got[1]["loaded"]


def _summary(tensors: dict) -> dict:
    from grpokit.checksums import tensors_sha256

    return {"sha256": tensors_sha256(tensors) if tensors else None, "count": len(tensors)}


def _rank_main(rank: int, port: int, out: Path, model: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from grpokit.fsdp import full_state_dict, load_full_state_dict, shard_model
    from grpokit.policy import LoraSettings, Policy
    from grpokit.registry.noise.qerl import QeRL

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("data_parallel",))

    def policies(lora):
        plain, sharded = (Policy(model=model, lora=lora, noise_scheduler=QeRL()) for _ in range(2))
        for p in (plain, sharded):
            torch.manual_seed(1)  # the same adapter in both (A random, B non-zero)
            p.configure_model()
            for name, param in p.lm.named_parameters():
                if "lora_B" in name:
                    param.data.normal_()
        shard_model(sharded.lm, mesh)
        assert sharded.sharded and not plain.sharded
        return plain, sharded

    result = {"reference": {}, "sharded": {}}
    for key, lora in (("full", None), ("lora", LoraSettings(rank=4))):
        plain, sharded = policies(lora)
        expected, update = plain.weight_update(3), sharded.weight_update(3)
        result["reference"][key], result["sharded"][key] = _summary(expected.tensors), _summary(update.tensors)
        result["reference"]["norms"], result["sharded"]["norms"] = _summary(expected.norm_tensors), _summary(update.norm_tensors)
        if key == "full":  # load other full weights into the sharded model: every rank's shards change
            new = {k: v + 1.0 for k, v in plain.lm.state_dict().items()}
            load_full_state_dict(sharded.lm, new)
            gathered = full_state_dict(sharded.lm)
            result["loaded"] = rank != 0 or all(torch.equal(gathered[k], new[k]) for k in gathered)
    (out / f"rank_{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    _rank_main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4])
