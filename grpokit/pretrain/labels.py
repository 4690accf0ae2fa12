"""Picture labels as the tower's pretraining target: the label values, the targets, the pooling heads.

Each picture has labels, a dict of key -> value (shapes: `{"colour": "red", "kind": "circle", "count":
"one", "side": "left"}`; a key a picture does not have, e.g. `side` for a shape across the middle, is
left out). Every key k is one classification over the values V_k seen in training: its head's logits
z_ik (|V_k| of them) for picture i are trained with cross-entropy, averaged over the pictures that have
the key, and the keys' losses are averaged:

    loss = 1/|K| sum_k  1/|I_k| sum_{i in I_k}  -log softmax(z_ik)[y_ik],    I_k = the pictures labelled k

(keys without a labelled picture in the batch are left out of the mean). A picture's predicted value for
k is argmax z_ik.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pad_sequence

Labels = dict[str, str]


def label_values(labels: list[Labels]) -> dict[str, list[str]]:
    """Each key's values, sorted (the key's head's outputs, in this order); keys sorted."""
    values: dict[str, set[str]] = {}
    for picture in labels:
        for key, value in picture.items():
            values.setdefault(str(key), set()).add(str(value))
    if not values:
        raise ValueError("the pictures have no labels: check --labels_field names a field of key -> value labels")
    return {key: sorted(values[key]) for key in sorted(values)}


def label_targets(labels: list[Labels], values: dict[str, list[str]]) -> torch.Tensor:
    """(len(labels), len(values)) long targets: the value's index for each key, -1 where a picture has
    no such key or a value training never saw."""
    target = torch.full((len(labels), len(values)), -1, dtype=torch.long)
    index = [{v: i for i, v in enumerate(vs)} for vs in values.values()]
    for row, picture in enumerate(labels):
        for col, key in enumerate(values):
            if key in picture:
                target[row, col] = index[col].get(str(picture[key]), -1)
    return target


class LabelHeads(nn.Module):
    """One learned query per key attends over a picture's tokens (any number per picture; padded and
    masked), and a linear map per key turns its pooled vector into that key's logits (SigLIP's attention
    pooling, one query per task)."""

    def __init__(self, hidden: int, values: dict[str, list[str]]) -> None:
        super().__init__()
        heads = hidden // 64 if hidden % 64 == 0 else 1
        self.queries = nn.Parameter(torch.randn(1, len(values), hidden) * 0.02)
        self.attend = nn.MultiheadAttention(hidden, heads, batch_first=True)
        self.norm = nn.LayerNorm(hidden)
        self.out = nn.ModuleList(nn.Linear(hidden, len(vs)) for vs in values.values())

    def forward(self, tokens: list[torch.Tensor]) -> list[torch.Tensor]:
        padded = pad_sequence(tokens, batch_first=True)
        lengths = torch.tensor([len(t) for t in tokens], device=padded.device)
        pad = torch.arange(padded.shape[1], device=padded.device)[None, :] >= lengths[:, None]
        queries = self.queries.expand(len(tokens), -1, -1)
        pooled, _ = self.attend(queries, padded, padded, key_padding_mask=pad)
        pooled = self.norm(pooled)
        return [out(pooled[:, k]) for k, out in enumerate(self.out)]


def label_loss(logits: list[torch.Tensor], target: torch.Tensor) -> torch.Tensor:
    """The mean over keys (those with a labelled picture here) of each key's cross-entropy."""
    losses = [
        nn.functional.cross_entropy(key_logits, target[:, k], ignore_index=-1)
        for k, key_logits in enumerate(logits)
        if (target[:, k] >= 0).any()
    ]
    return torch.stack(losses).mean()


def label_accuracy(logits: list[torch.Tensor], target: torch.Tensor, keys: list[str]) -> dict[str, float]:
    """Held-out accuracy per key (over the pictures that have it), and `mean`, their mean."""
    found = {}
    for k, key in enumerate(keys):
        has = target[:, k] >= 0
        if has.any():
            found[key] = (logits[k].argmax(-1)[has] == target[has, k]).float().mean().item()
    found["mean"] = sum(found.values()) / max(len(found), 1)
    return found
