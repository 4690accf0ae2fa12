"""SFT examples packed into one micro-batch give the loss and gradient of the same examples trained one
per micro-batch (float64, the trainer's own logprob path and normaliser)."""

import pytest
import torch

from grpokit.common.models import load_tokenizer
from grpokit.orchestrator.packing import pack
from grpokit.registry.losses.nll import NLL
from grpokit.sft.datamodule import as_rollout
from grpokit.sft.render import ChatRenderer
from grpokit.trainer.policy import Policy
from grpokit.types import TrainingBatch

CHATS = [
    [{"role": "user", "content": "Reverse: hello world"}, {"role": "assistant", "content": "dlrow olleh"}],
    [
        {"role": "user", "content": "2 + 3?"},
        {"role": "assistant", "content": "5"},
        {"role": "user", "content": "times 4?"},
        {"role": "assistant", "content": "20, since 5 * 4 = 20."},
    ],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hi!"},
    ],
]


def loss_and_grads(policy: Policy, batch: TrainingBatch) -> tuple[float, dict[str, torch.Tensor]]:
    policy.lm.zero_grad(set_to_none=True)
    total = 0.0
    for mb in batch.micro_batches:
        loss, _ = NLL()(policy.loss_inputs(mb, batch))
        loss.backward()
        total += float(loss.detach())
    return total, {n: p.grad.clone() for n, p in policy.lm.named_parameters() if p.grad is not None}


# With shared prefixes a shared node's gradient is summed before transformers' float32 RMSNorm instead of
# after (docs/architecture.md, "Shared prefixes run once"): equal up to float32 rounding, not float64's.
@pytest.mark.parametrize("share_prefixes, rtol", [(False, 1e-10), (True, 1e-5)])
def test_packed_equals_unpacked_loss_and_gradient(tiny_model, share_prefixes, rtol):
    renderer = ChatRenderer(load_tokenizer(tiny_model))
    rollouts = [as_rollout(renderer.render(chat), i) for i, chat in enumerate(CHATS)]
    zeros = [[0.0] * r.num_tokens for r in rollouts]
    packed = pack(rollouts, zeros, [True] * 3, seq_len=512)
    separate = [pack([r], [z], [True], seq_len=512)[0] for r, z in zip(rollouts, zeros)]
    assert len(packed) == 1 and packed[0].num_tokens == sum(mb.num_tokens for mb in separate)
    policy = Policy(model=tiny_model, loss=NLL(), attention="dense", share_prefixes=share_prefixes)
    policy.configure_model()
    policy.lm.double()
    a = loss_and_grads(policy, TrainingBatch(step=0, micro_batches=packed))
    b = loss_and_grads(policy, TrainingBatch(step=0, micro_batches=separate))
    assert a[0] == pytest.approx(b[0], rel=1e-12)
    assert a[0] > 1.0  # a random model: the NLL is near log(vocab), not 0
    assert a[1].keys() == b[1].keys() and len(a[1]) > 0
    for name in a[1]:
        torch.testing.assert_close(a[1][name], b[1][name], rtol=rtol, atol=rtol * 1e-2, msg=name)
