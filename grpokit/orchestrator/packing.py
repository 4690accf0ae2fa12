"""Packing rollouts into micro-batches of at most seq_len tokens, or of at most seq_len distinct prefix-tree
nodes when the trainer runs each shared prefix once (first-fit decreasing either way).

The trainer's cost of a micro-batch is the number of positions its model runs: every token with the
packed row, every distinct prefix with `model.share_prefixes` (grpokit.common.prefix_tree). A GRPO step
repeats each prompt G times behind one system prompt, so counting tokens splits a step that the tree
runs in one forward: on the CPU demo, 1,113 tokens are 157 nodes, and one micro-batch instead of two
trains the step 30% faster (docs/benchmarks.md).

Rollouts with images (Rollout.vision) are packed by tokens: the trainer scores their rows with the model's
own positions and never by prefix tree (grpokit.vision.logprobs), and each micro-batch carries its
sequences' image inputs concatenated in row order (grpokit.vision.inputs.concat), as the model fills its
image placeholders in that order.
"""

from __future__ import annotations

import functools
import logging

import torch

from grpokit.common.prefix_tree import attach_prefix_trees, tree_of
from grpokit.types import MicroBatch, Rollout
from grpokit.vision.inputs import concat

log = logging.getLogger(__name__)


def check_fits(length: int, capacity: int) -> None:
    """A sequence longer than a whole micro-batch cannot be packed (tokens and tree nodes alike)."""
    if length > capacity:
        raise ValueError(
            f"a sequence of {length} tokens exceeds data.seq_len={capacity}: raise seq_len or lower sampling.max_tokens"
        )


def first_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Group item indices into bins whose lengths sum to <= capacity, longest items first."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        check_fits(lengths[i], capacity)
        for b, free in enumerate(room):
            if lengths[i] <= free:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(capacity - lengths[i])
    return [sorted(b) for b in bins]


def first_fit_decreasing_tree(sequences: list[list[int]], capacity: int) -> list[list[int]]:
    """Group sequence indices into bins whose prefix trees have <= capacity nodes, longest first: a
    sequence costs a bin only its tokens after the longest prefix already in that bin."""
    bins: list[list[int]] = []
    tries: list[dict] = []  # each bin's trie: token -> child trie
    sizes: list[int] = []
    for i in sorted(range(len(sequences)), key=lambda i: -len(sequences[i])):
        seq = sequences[i]
        check_fits(len(seq), capacity)
        for b, trie in enumerate(tries):
            new = len(seq) - _shared_depth(trie, seq)
            if sizes[b] + new <= capacity:
                break
        else:
            b, new = len(bins), len(seq)
            bins.append([])
            tries.append({})
            sizes.append(0)
        bins[b].append(i)
        sizes[b] += new
        node = tries[b]
        for token in seq:
            node = node.setdefault(token, {})
    return [sorted(b) for b in bins]


def _shared_depth(trie: dict, seq: list[int]) -> int:
    """How many leading tokens of `seq` the trie already holds."""
    depth = 0
    for token in seq:
        if token not in trie:
            break
        trie, depth = trie[token], depth + 1
    return depth


def pack(
    rollouts: list[Rollout],
    advantages: list[list[float]],
    trainable: list[bool],
    seq_len: int,
    prefix_tree: bool = False,
) -> list[MicroBatch]:
    """Pack rollouts (prompt + completion each) into micro-batches.

    `advantages` holds one value per completion token of each rollout (Advantage.token_advantages).
    loss_mask is 1 on completion tokens the policy wrote, 0 on prompts and on rollouts that are not
    trainable (flagged by an enforcing filter). An expert rollout's completion tokens go to expert_mask
    instead of loss_mask. With `prefix_tree`, seq_len bounds each micro-batch's distinct prefixes (what a
    trainer that shares prefixes runs) instead of its tokens; not with images (see the module docstring).
    """
    if prefix_tree and any(r.vision for r in rollouts):
        _note_token_packing()
        prefix_tree = False
    if prefix_tree:
        bins = first_fit_decreasing_tree([r.prompt_ids + r.completion_ids for r in rollouts], seq_len)
    else:
        bins = first_fit_decreasing([r.num_tokens for r in rollouts], seq_len)
    micro_batches = [
        _micro_batch([rollouts[i] for i in b], [advantages[i] for i in b], [trainable[i] for i in b]) for b in bins
    ]
    if prefix_tree:  # the trainer runs these trees: built once here, carried with the batch
        attach_prefix_trees(micro_batches)
    return micro_batches


def _micro_batch(rollouts: list[Rollout], advantages: list[list[float]], trainable: list[bool]) -> MicroBatch:
    ids, pos, mask, adv, logp, expert = [], [], [], [], [], []
    for r, a, keep in zip(rollouts, advantages, trainable):
        p, c = len(r.prompt_ids), len(r.completion_ids)
        ids += r.prompt_ids + r.completion_ids
        pos += list(range(p + c))
        trained = [float(m) * keep for m in r.completion_mask]
        mask += [0.0] * p + ([0.0] * c if r.is_expert else trained)
        expert += [0.0] * p + (trained if r.is_expert else [0.0] * c)
        if len(a) != c:
            raise ValueError(f"rollout {r.example_id}: {len(a)} token advantages for {c} completion tokens")
        adv += [0.0] * p + list(a)
        logp += [0.0] * p + r.completion_logprobs
    return MicroBatch(
        input_ids_T=torch.tensor(ids, dtype=torch.long),
        position_ids_T=torch.tensor(pos, dtype=torch.long),
        loss_mask_T=torch.tensor(mask, dtype=torch.float32),
        advantages_T=torch.tensor(adv, dtype=torch.float32),
        inference_logprobs_T=torch.tensor(logp, dtype=torch.float32),
        seq_lens_N=torch.tensor([r.num_tokens for r in rollouts], dtype=torch.long),
        is_truncated_N=torch.tensor([r.is_truncated for r in rollouts], dtype=torch.bool),
        expert_mask_T=torch.tensor(expert, dtype=torch.float32),
        vision=concat([r.vision for r in rollouts if r.vision]) if any(r.vision for r in rollouts) else None,
    )


def num_positions(mb: MicroBatch, prefix_tree: bool) -> int:
    """The positions the trainer's model runs for `mb`: its distinct prefixes, or its tokens (with images,
    always its tokens)."""
    return tree_of(mb).num_nodes if prefix_tree and mb.vision is None else mb.num_tokens


@functools.cache
def _note_token_packing() -> None:
    """Say once a process, not at every step, that batches with images are packed by tokens (module docstring)."""
    log.info("batches with images are packed by tokens, not by prefix tree (data.packing): see grpokit.vision")
