"""The batch codec carries a micro-batch's prefix tree and refuses batches of the old format (version 1)
with the fix; a micro-batch's counts are recomputed, never trusted from the wire."""

import json

import pytest
from safetensors.torch import load, save

from grpokit.common.prefix_tree import attach_prefix_trees, prefix_tree
from grpokit.transport.codec import BatchFormatError, decode_batch, encode_batch
from tests.support import assert_same_batch, make_training_batch


def test_prefix_trees_travel_with_their_micro_batches():
    batch = make_training_batch(3)
    attach_prefix_trees(batch.micro_batches)
    batch.micro_batches[1].prefix_tree = None  # one micro-batch without a tree stays without
    decoded = decode_batch(encode_batch(batch))
    assert_same_batch(decoded, batch)
    mb = decoded.micro_batches[0]
    assert mb.prefix_tree is not None and decoded.micro_batches[1].prefix_tree is None
    expected = prefix_tree(mb.input_ids_T, mb.position_ids_T, mb.seq_lens_N)
    assert mb.prefix_tree.num_nodes == expected.num_nodes and (mb.prefix_tree.node_T == expected.node_T).all()


def test_a_version_1_batch_is_refused_with_the_fix():
    data = encode_batch(make_training_batch(0))
    n = int.from_bytes(data[:8], "little")
    metadata = json.loads(data[8 : 8 + n])["__metadata__"]
    old = save(load(data), metadata={**metadata, "version": "1"})
    with pytest.raises(BatchFormatError, match="version 1, written by grpokit before .*delete a run's rollouts"):
        decode_batch(old)


def test_counts_are_the_masks_counts():
    batch = make_training_batch(1, tokens=10)
    mb = batch.micro_batches[0]
    mb.loss_mask_T[:4] = 0  # changed after construction: the wire carries the mask, the count follows it
    decoded = decode_batch(encode_batch(batch)).micro_batches[0]
    assert decoded.num_loss_tokens == 6 and decoded.num_loss_seqs == 1 and decoded.num_expert_tokens == 0
