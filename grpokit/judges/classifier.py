"""A classifier reward model: `AutoModelForSequenceClassification` with one label, a scalar per conversation.

The conversation is rendered with the reward model's own chat template (the text it was trained on;
grpokit.judges.template's plain rendering for a tokenizer without one), tokenized, and the batch run in
one forward with right padding and an attention mask; the score is the one logit, read by transformers
at each row's last real token. The model is its own frozen copy (eval mode, no gradients), loaded at the
first batch. tests/judges/test_classifier.py checks the scores equal a direct transformers forward of each
conversation alone.
"""

from __future__ import annotations

from typing import Any

import torch

from grpokit.common.models import resolve_model
from grpokit.judges.backends import JudgeReply
from grpokit.judges.template import render_conversation


class ClassifierReward:
    """Scores conversations with a sequence-classification reward model (`num_labels` 1)."""

    def __init__(
        self, model: str, max_batch_size: int = 16, max_length: int | None = None, device: str = "cpu"
    ) -> None:
        self.model_name, self.max_batch_size, self.max_length, self.device = model, max_batch_size, max_length, device
        self.identity = f"classifier:{model}"
        self.model = None

    def setup(self) -> None:
        """Load the reward model and its tokenizer; refuse one that has more than one label."""
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        path = resolve_model(self.model_name)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.tokenizer.padding_side = "right"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        model = AutoModelForSequenceClassification.from_pretrained(path, torch_dtype=torch.float32)
        if model.config.num_labels != 1:
            raise ValueError(
                f"judge.model {self.model_name!r} has {model.config.num_labels} labels; a reward model has one"
            )
        model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model = model.to(self.device).eval().requires_grad_(False)

    def text(self, conversation: list[dict[str, Any]]) -> str:
        """The conversation as the reward model reads it."""
        if self.tokenizer.chat_template:
            return self.tokenizer.apply_chat_template(conversation, tokenize=False)
        return render_conversation(conversation)

    @torch.no_grad()
    def score(self, conversations: list[list[dict[str, Any]]]) -> list[float]:
        """One scalar per conversation (NaN stays NaN: the caller counts it as a failure)."""
        if self.model is None:
            self.setup()
        out: list[float] = []
        for start in range(0, len(conversations), self.max_batch_size):
            texts = [self.text(c) for c in conversations[start : start + self.max_batch_size]]
            batch = self.tokenizer(
                texts,
                return_tensors="pt",
                padding=True,
                truncation=self.max_length is not None,
                max_length=self.max_length,
                add_special_tokens=False,
            ).to(self.device)
            logits = self.model(**batch).logits
            out.extend(float(x) for x in logits[:, 0])
        return out

    def judge_conversations(self, conversations: list[list[dict[str, Any]]]) -> list[JudgeReply]:
        """One reply per conversation: its score as text (a NaN stays "nan": the caller counts it)."""
        return [JudgeReply(repr(x)) for x in self.score(conversations)]
