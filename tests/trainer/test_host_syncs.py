"""Host syncs per trainer step: the batch's counts are recorded when it is packed, so a step's syncs
grow linearly with its micro-batches (the old per-micro-batch recount of every micro-batch was M^2).

On the CPU nothing waits, so this counts the calls that wait for the device on a GPU: .item(), .tolist(),
.cpu(), int()/float()/bool() of a tensor, nonzero."""

import torch
from torch.overrides import TorchFunctionMode

from grpokit.bench.trainer import bench_policy, micro_batch
from grpokit.types import TrainingBatch

SYNCS = {
    torch.Tensor.item,
    torch.Tensor.tolist,
    torch.Tensor.cpu,
    torch.Tensor.numpy,
    torch.Tensor.__bool__,
    torch.Tensor.__int__,
    torch.Tensor.__float__,
    torch.Tensor.__index__,
    torch.Tensor.nonzero,
    torch.nonzero,
}


class CountSyncs(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += func in SYNCS
        return func(*args, **(kwargs or {}))


def test_the_counter_counts():
    with CountSyncs() as c:
        torch.ones(3).sum().item()
        int(torch.ones(()))
    assert c.count == 2


def steps_syncs(policy, micro_batches: int) -> int:
    batch = TrainingBatch(step=0, micro_batches=[micro_batch(48, 12, 500, "cpu") for _ in range(micro_batches)])
    opt = policy.make_optimizer()
    with CountSyncs() as c:
        policy.train_batch(batch, opt)
        _ = (batch.num_loss_tokens, batch.num_loss_seqs, batch.num_expert_tokens)  # read M times a step
    return c.count


def test_syncs_per_step_grow_linearly_with_micro_batches(tiny_model):
    policy = bench_policy(tiny_model, torch.float32, "cpu", lora_rank=4, chunk_size=0, checkpointing=False,
                          compile=False, attention="dense")  # fmt: skip
    counts = {m: steps_syncs(policy, m) for m in (1, 2, 4, 8)}
    per_micro_batch = counts[2] - counts[1]
    assert [counts[m] - counts[1] for m in (2, 4, 8)] == [per_micro_batch * k for k in (1, 3, 7)], counts


def test_the_batch_counts_need_no_sync():
    batch = TrainingBatch(step=0, micro_batches=[micro_batch(48, 12, 500, "cpu") for _ in range(4)])
    with CountSyncs() as c:
        assert batch.num_loss_tokens == 4 * 44 and batch.num_loss_seqs == 16 and batch.num_expert_tokens == 0
    assert c.count == 0
