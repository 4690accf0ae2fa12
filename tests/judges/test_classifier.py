"""A classifier reward model's score equals a direct transformers forward of each conversation alone,
though the judge runs them as one padded batch (grpokit.judges.classifier)."""

import pytest
import torch

from grpokit.judges.classifier import ClassifierReward

CONVERSATIONS = [
    [{"role": "user", "content": "Reverse: abc"}, {"role": "assistant", "content": "cba"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Reverse the words of a rather longer sentence than the first one"},
        {"role": "assistant", "content": "one first the than sentence longer rather a of words the Reverse"},
    ],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": ""}],
]


@pytest.fixture(scope="module")
def reward_model(tiny_model, tmp_path_factory):
    """The tiny Llama's config and tokenizer as a one-label sequence classifier (random score head)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

    torch.manual_seed(3)
    config = LlamaConfig.from_pretrained(tiny_model, num_labels=1)
    path = tmp_path_factory.mktemp("tiny-rm")
    LlamaForSequenceClassification(config).save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(path)
    return str(path)


def test_scores_equal_a_direct_forward_of_each_conversation(reward_model):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    scores = ClassifierReward(reward_model, max_batch_size=8).score(CONVERSATIONS)
    tokenizer = AutoTokenizer.from_pretrained(reward_model)
    model = AutoModelForSequenceClassification.from_pretrained(reward_model).eval()
    for conversation, score in zip(CONVERSATIONS, scores):
        ids = tokenizer.apply_chat_template(conversation, tokenize=True, return_dict=False, return_tensors="pt")
        with torch.no_grad():
            direct = model(input_ids=ids).logits[0, 0].item()
        assert score == pytest.approx(direct, abs=1e-5)
    assert len(set(scores)) == 3  # three conversations, three scores: the batch is not read at one row


def test_a_model_with_more_than_one_label_is_refused(tiny_model, tmp_path):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

    LlamaForSequenceClassification(LlamaConfig.from_pretrained(tiny_model, num_labels=2)).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="2 labels"):
        ClassifierReward(str(tmp_path)).setup()
