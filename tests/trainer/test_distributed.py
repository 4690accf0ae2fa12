"""grpokit.trainer.distributed: which micro-batches each DDP rank trains, the batch and metrics exchange between
ranks (a real 2-process gloo group), and the refusals of trainer setups grpokit cannot run.

The 2-process test runs this file as a script, once per rank; each rank writes what it got to a JSON
file that the test compares.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch

from grpokit.testing import free_port
from grpokit.trainer.distributed import check_trainer_processes, rank_share
from tests.support import make_training_batch

REPO = Path(__file__).resolve().parents[2]


def test_rank_share_is_round_robin_and_covers_every_micro_batch_once():
    mbs = (
        make_training_batch(0).micro_batches
        + make_training_batch(1).micro_batches
        + make_training_batch(2).micro_batches[:1]
    )
    assert len(mbs) == 5
    shares = [rank_share(mbs, rank, 2) for rank in range(2)]
    ids = {id(mb): i for i, mb in enumerate(mbs)}
    assert [[ids[id(mb)] for mb, _ in s] for s in shares] == [[0, 2, 4], [1, 3]]
    assert all(counts for s in shares for _, counts in s)
    assert [len(rank_share(mbs, rank, 8)) for rank in range(8)] == [1] * 8  # 3 stand-ins


def test_a_rank_without_micro_batches_runs_a_zero_loss_stand_in():
    (mb,) = make_training_batch(0).micro_batches[:1]
    ((stand_in, counts),) = rank_share([mb], 1, 2)
    assert not counts
    assert torch.equal(stand_in.input_ids_T, mb.input_ids_T) and torch.equal(stand_in.seq_lens_N, mb.seq_lens_N)
    assert not stand_in.loss_mask_T.any() and not stand_in.expert_mask_T.any() and not stand_in.advantages_T.any()
    assert mb.loss_mask_T.all()  # the real micro-batch is untouched
    assert rank_share([], 1, 2) == []  # a step with nothing to train: no rank runs a backward


def test_fsdp_ranks_get_equal_shares_padded_with_stand_ins():
    mbs = (
        make_training_batch(0).micro_batches
        + make_training_batch(1).micro_batches
        + make_training_batch(2).micro_batches[:1]
    )
    ids = {id(mb): i for i, mb in enumerate(mbs)}
    shares = [rank_share(mbs, rank, 2, equal=True) for rank in range(2)]
    assert [[ids.get(id(mb)) for mb, _ in s] for s in shares] == [
        [0, 2, 4],
        [1, 3, None],
    ]  # every FSDP forward is a collective
    assert [[c for _, c in s] for s in shares] == [[True] * 3, [True, True, False]]
    assert not shares[1][2][0].loss_mask_T.any() and not shares[1][2][0].advantages_T.any()
    assert [len(rank_share(mbs, rank, 8, equal=True)) for rank in range(8)] == [1] * 8
    assert rank_share([], 1, 2, equal=True) == []


def test_fsdp2_is_accepted_and_fsdp1_deepspeed_and_tensor_parallel_are_refused_with_the_fix():
    from types import SimpleNamespace

    from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy, ModelParallelStrategy

    from grpokit.trainer.fsdp import FSDP2Strategy

    check_trainer_processes(
        L.Trainer(strategy="fsdp2", devices=2, accelerator="cpu", logger=False), run_name_given=True
    )
    assert isinstance(L.Trainer(strategy="fsdp2", devices=2, accelerator="cpu", logger=False).strategy, FSDP2Strategy)
    with pytest.raises(ValueError, match="use trainer.strategy: fsdp2"):
        check_trainer_processes(SimpleNamespace(strategy=FSDPStrategy(), world_size=2), run_name_given=True)
    with pytest.raises(ValueError, match="use trainer.strategy: fsdp2"):
        check_trainer_processes(
            SimpleNamespace(strategy=ModelParallelStrategy(tensor_parallel_size=2), world_size=2), run_name_given=True
        )
    with pytest.raises(ValueError, match="DeepSpeed is not supported"):
        check_trainer_processes(
            SimpleNamespace(strategy=DeepSpeedStrategy.__new__(DeepSpeedStrategy), world_size=2), run_name_given=True
        )


def test_fsdp2_refuses_policy_settings_it_cannot_shard():
    from grpokit.trainer.model_setup import shard

    with pytest.raises(ValueError, match="model.compile: True with trainer.strategy fsdp2.*unset model.compile"):
        shard(torch.nn.Linear(1, 1), mesh=None, quantization=None, compiled=True)


def test_refuses_several_processes_without_run_name_or_with_spawned_ranks():
    ddp = L.Trainer(strategy="ddp", devices=2, accelerator="cpu", logger=False)
    check_trainer_processes(ddp, run_name_given=True)
    with pytest.raises(ValueError, match="set --run_name"):
        check_trainer_processes(ddp, run_name_given=False)
    with pytest.raises(ValueError, match="trainer.strategy ddp_spawn"):
        check_trainer_processes(
            L.Trainer(strategy="ddp_spawn", devices=2, accelerator="cpu", logger=False), run_name_given=True
        )
    check_trainer_processes(L.Trainer(devices=1, accelerator="cpu", logger=False), run_name_given=False)


def test_two_ranks_share_rank_zeros_batch_and_gather_every_ranks_metrics(tmp_path):
    port = free_port()
    # the ranks run this file as a script: the repository on their path, so that tests.support imports
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    procs = [
        subprocess.Popen([sys.executable, __file__, str(rank), str(port), str(tmp_path)], env=env) for rank in range(2)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    got = [json.loads((tmp_path / f"rank_{rank}.json").read_text()) for rank in range(2)]
    assert got[0] == got[1]
    assert got[0]["loss"] == 0.5 + 1.5
    assert got[0]["metrics"] == [{"kl": 0.0}, {"kl": 1.0}, {"kl": 2.0}] and got[0]["weights"] == [3.0, 4.0, 5.0]


def _rank_main(rank: int, port: int, out: Path) -> None:
    """One rank: receive rank 0's batch (checked equal to the batch rank 0 sent), gather a step's results."""
    import torch.distributed as dist

    from grpokit.trainer.distributed import gather_step
    from grpokit.transport import share_batch
    from tests.support import assert_same_batch

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    received = share_batch(make_training_batch(7) if rank == 0 else None)
    assert_same_batch(received, make_training_batch(7))
    metrics = [{"kl": torch.tensor(0.0)}, {"kl": torch.tensor(1.0)}] if rank == 0 else [{"kl": torch.tensor(2.0)}]
    loss, metrics, weights = gather_step(0.5 if rank == 0 else 1.5, metrics, [3.0, 4.0] if rank == 0 else [5.0])
    (out / f"rank_{rank}.json").write_text(json.dumps({"loss": loss, "metrics": metrics, "weights": weights}))
    dist.destroy_process_group()


if __name__ == "__main__":
    _rank_main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
