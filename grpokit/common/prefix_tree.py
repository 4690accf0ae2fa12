"""Shared prefixes of packed sequences, computed once: the micro-batch as a token tree.

A GRPO micro-batch holds G completions of each prompt, and often one system prompt for all of them, so
most of its tokens are copies. In a causal decoder a token's hidden states depend only on the tokens
before it in its own sequence, so every sequence that starts with the same tokens has the same hidden
states there. The trainer therefore runs the model on a tree (a trie of the packed sequences): one node
per distinct prefix, a node attending to itself and its ancestors, position id = depth. Each original
token maps to its node; a logprob of token t is read at the node of token t - 1. Values are those of
the packed row (up to float summation order), and so are the gradients: a shared node's activations
receive the sum of the gradients that its copies would have received.

On the SmolLM2 reverse-text demo (32 rollouts of 4 prompts sharing one system prompt) a micro-batch
of ~1,300 tokens becomes a tree of a few hundred nodes. The tree needs an arbitrary [U, U] mask, so it
runs on the dense attention path (the CPU default); varlen attention keeps the packed row.

Shape legend: T packed tokens, N sequences, U tree nodes.
"""

from __future__ import annotations

import torch

from grpokit.types import MicroBatch, PrefixTree

__all__ = ["PrefixTree", "attach_prefix_trees", "prefix_tree"]


def prefix_tree(input_ids_T: torch.Tensor, position_ids_T: torch.Tensor, seq_lens_N: torch.Tensor) -> PrefixTree:
    """The trie of the packed sequences (each starts at position 0 and counts up by one)."""
    ids, lens = input_ids_T.tolist(), seq_lens_N.tolist()
    expected = [p for n in lens for p in range(n)]
    if position_ids_T.tolist() != expected:
        raise ValueError(
            "prefix sharing needs each packed sequence's position_ids "
            "to be 0, 1, 2, ...; set model.share_prefixes: false"
        )
    children: dict[tuple[int, int], int] = {}
    tokens, depths, parents, node_T = [], [], [], []
    t = 0
    for n in lens:
        parent = -1
        for depth in range(n):
            key = (parent, ids[t])
            node = children.get(key)
            if node is None:
                node = children[key] = len(tokens)
                tokens.append(ids[t])
                depths.append(depth)
                parents.append(parent)
            node_T.append(node)
            parent = node
            t += 1
    device = input_ids_T.device

    def as_tensor(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    return PrefixTree(as_tensor(tokens), as_tensor(depths), as_tensor(node_T), as_tensor(parents))


def attach_prefix_trees(micro_batches: list[MicroBatch]) -> None:
    """Give each micro-batch its prefix tree, built once here (on the micro-batches' device: call it on
    the CPU copy) and carried with the micro-batch; micro-batches that have one keep it. A micro-batch with
    images gets none: it is never scored by prefix tree (grpokit.vision.logprobs)."""
    for mb in micro_batches:
        if mb.vision is None:
            tree_of(mb)


def tree_of(mb: MicroBatch) -> PrefixTree:
    """`mb`'s prefix tree, built on first use and kept on the micro-batch (policy, reference and teacher
    logprobs and the packing metric all read the same one)."""
    if mb.prefix_tree is None:
        mb.prefix_tree = prefix_tree(mb.input_ids_T, mb.position_ids_T, mb.seq_lens_N)
    return mb.prefix_tree
