"""grpokit.trainer.fsdp and the Policy's sharded paths, on a real 2-process gloo group: the weights a sharded
Policy publishes (full fine-tuning, a LoRA adapter, QeRL noisy norms) are bit-identical to the unsharded
Policy's, and full weights loaded into a sharded model land in every shard.

The test runs this file as a script, once per rank; each rank writes what it got to a JSON file.
(The whole `grpokit fit --trainer.strategy fsdp2` run is tests/integration/test_fsdp.py.)
"""

import json
import subprocess
import sys
from pathlib import Path

from grpokit.testing import free_port


def test_sharded_policy_publishes_what_the_unsharded_one_does(tmp_path, tiny_model):
    port = free_port()
    procs = [
        subprocess.Popen([sys.executable, __file__, str(rank), str(port), str(tmp_path), tiny_model])
        for rank in range(2)
    ]
    assert [p.wait(timeout=180) for p in procs] == [0, 0]
    got = [json.loads((tmp_path / f"rank_{rank}.json").read_text()) for rank in range(2)]
    reference, rank0, rank1 = got[0]["reference"], got[0]["sharded"], got[1]["sharded"]
    assert rank0 == reference  # full weights, adapter and noisy norms: the same bytes
    assert rank1["full"] == {"sha256": None, "count": 0}  # full weights are gathered onto rank 0 only
    assert (
        rank1["lora"] == reference["lora"] and rank1["norms"] == reference["norms"]
    )  # adapter and norms on every rank
    assert got[0]["loaded"] and got[1]["loaded"]
    for rank in range(2):  # chunked logprobs (the CUDA default) run inside the sharded root's forward
        assert all(diff < 1e-5 for diff in got[rank]["chunked_diff"].values()), got[rank]["chunked_diff"]


def _chunked_logprobs_diff(plain, sharded) -> float:
    """Largest difference between the two policies' chunked logprobs of the loss tokens, and between
    their gradients (the sharded ones gathered)."""
    import torch

    from grpokit.common.logprobs import packed_token_logprobs

    ids_T = torch.randint(0, 200, (20,), generator=torch.Generator().manual_seed(0))
    pos_T, lens_N = torch.cat([torch.arange(12), torch.arange(8)]), torch.tensor([12, 8])
    needed_T = pos_T >= 4  # the completions
    out = []
    for policy in (plain, sharded):
        lp_T = packed_token_logprobs(policy.lm, ids_T, pos_T, lens_N, 0.7, chunk_size=5, needed_T=needed_T)
        (lp_T * torch.linspace(-1, 1, 20)).sum().backward()
        grads = {n: p.grad for n, p in policy.lm.named_parameters() if p.grad is not None}
        out.append((lp_T.detach(), {n: g.full_tensor() if hasattr(g, "full_tensor") else g for n, g in grads.items()}))
        policy.lm.zero_grad(set_to_none=True)
    (lp_plain, g_plain), (lp_sharded, g_sharded) = out
    assert g_plain.keys() == g_sharded.keys() and g_plain
    return max(
        [float((lp_plain - lp_sharded).abs().max())] + [float((g_plain[n] - g_sharded[n]).abs().max()) for n in g_plain]
    )


def _summary(tensors: dict) -> dict:
    from grpokit.common.checksums import tensors_sha256

    return {"sha256": tensors_sha256(tensors) if tensors else None, "count": len(tensors)}


def _rank_main(rank: int, port: int, out: Path, model: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from grpokit.registry.noise.qerl import QeRL
    from grpokit.trainer.fsdp import full_state_dict, load_full_state_dict, shard_model
    from grpokit.trainer.policy import LoraSettings, Policy

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

    result = {"reference": {}, "sharded": {}, "chunked_diff": {}}
    for key, lora in (("full", None), ("lora", LoraSettings(rank=4))):
        plain, sharded = policies(lora)
        result["chunked_diff"][key] = _chunked_logprobs_diff(plain, sharded)
        expected, update = plain.weight_update(3), sharded.weight_update(3)
        result["reference"][key], result["sharded"][key] = _summary(expected.tensors), _summary(update.tensors)
        result["reference"]["norms"], result["sharded"]["norms"] = (
            _summary(expected.norm_tensors),
            _summary(update.norm_tensors),
        )
        if key == "full":  # load other full weights into the sharded model: every rank's shards change
            new = {k: v + 1.0 for k, v in plain.lm.state_dict().items()}
            load_full_state_dict(sharded.lm, new)
            gathered = full_state_dict(sharded.lm)
            result["loaded"] = rank != 0 or all(torch.equal(gathered[k], new[k]) for k in gathered)
    (out / f"rank_{rank}.json").write_text(json.dumps(result))
    dist.barrier()  # both ranks tear gloo down together: one leaving mid-collective aborted the other (SIGABRT)
    dist.destroy_process_group()


if __name__ == "__main__":
    _rank_main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4])
