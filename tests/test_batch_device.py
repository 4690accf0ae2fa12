"""Policy.training_step takes Lightning's dataloader iterator, so Lightning does not move the batch to
the training device: Policy does, with Lightning's move_data_to_device. That must reach every tensor
of a TrainingBatch (nested dataclasses), which the meta device shows without a GPU."""

import torch
from lightning.fabric.utilities.apply_func import move_data_to_device

from tests.support import assert_same_batch, make_training_batch


def test_move_data_to_device_moves_every_tensor_of_a_training_batch():
    batch = make_training_batch(3)
    moved = move_data_to_device(batch, torch.device("meta"))
    tensors = [v for mb in moved.micro_batches for v in vars(mb).values() if isinstance(v, torch.Tensor)]
    assert tensors and all(t.device.type == "meta" for t in tensors)
    assert moved.step == batch.step and moved.metrics == batch.metrics and moved.temperature == batch.temperature
    assert all(
        t.device.type == "cpu" for mb in batch.micro_batches for t in vars(mb).values() if isinstance(t, torch.Tensor)
    )  # the original stays
    assert_same_batch(move_data_to_device(batch, torch.device("cpu")), batch)
