"""Train a small classifier reward model on synthetic texts labelled by a rule, for a judge recipe.

    python -m grpokit.envs.exclaim.train_judge --out outputs/judges/exclaim-rm

The judge recipe (recipes/judge_exclaim.yaml, docs/judges.md) needs a reward model that prefers something
a CPU run can learn and a rule can check independently. This trains one in about a minute on 2 CPU
cores: a random 2-layer, hidden-64 LlamaForSequenceClassification (one label) with SmolLM2's tokenizer,
regressed (MSE) onto 1.0 for a reply that contains an exclamation mark and 0.0 for one that does not, so
its score is about a [0, 1] preference. The texts are conversations as the recipe's environment shows
them (envs/exclaim: its system prompt and a question on a topic) whose replies are random words from the
tokenizer's vocabulary, so that nearly every word embedding is trained to mean nothing and only the
punctuation decides; replies end with ".", "?", ",", "..." or nothing, or carry "!" somewhere. The rule
(`has_exclamation`) is the same as the environment's `exclaims` metric, the run's independent check.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import torch

from grpokit.envs.exclaim import ASKS, SYSTEM_PROMPT, TOPICS, exclaims

POSITIVE_MARKS = ("!", "!", "!!", '!"', "! ", "!)")
NEGATIVE_MARKS = (".", ".", "?", ",", "...", "", ";", ":")


def word_pool(tokenizer) -> list[str]:
    """Alphabetic words of the tokenizer's vocabulary (tokens that start a word), the replies' words."""
    words = []
    for token in tokenizer.get_vocab():
        text = tokenizer.convert_tokens_to_string([token])
        if text.startswith(" ") and text[1:].isalpha():
            words.append(text[1:])
    return sorted(words)


def synthetic_reply(rng: random.Random, words: list[str], positive: bool) -> str:
    """A reply of 1-3 random-word sentences; a positive one has "!" in at least one place."""
    sentences = rng.randint(1, 3)
    marked = rng.randrange(sentences) if positive else -1
    out = []
    for s in range(sentences):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(2, 12)))
        text = text[0].upper() + text[1:] if rng.random() < 0.8 else text
        mark = rng.choice(POSITIVE_MARKS) if s == marked else rng.choice(NEGATIVE_MARKS)
        out.append((text + mark).strip())
    return " ".join(out)


def synthetic_example(rng: random.Random, words: list[str]) -> tuple[list[dict[str, str]], float]:
    """A conversation as envs/exclaim shows it, and its label by the rule."""
    reply = synthetic_reply(rng, words, positive=rng.random() < 0.5)
    conversation = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": rng.choice(ASKS).format(rng.choice(TOPICS))},
        {"role": "assistant", "content": reply},
    ]
    return conversation, has_exclamation(reply)


def has_exclamation(reply: str) -> float:
    """The rule the classifier learns: envs/exclaim's `exclaims` metric."""
    return exclaims(reply)


def build_model(tokenizer, seed: int):
    """A random one-label sequence classifier the size of the tests' tiny model."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=512,
        num_labels=1, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    return LlamaForSequenceClassification(config)


def batch_of(tokenizer, conversations: list, labels: list[float]) -> tuple[dict, torch.Tensor]:
    """Tokenized conversations (as grpokit.judges.classifier renders them) and their labels."""
    texts = [tokenizer.apply_chat_template(c, tokenize=False) for c in conversations]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    return dict(batch), torch.tensor(labels, dtype=torch.float32)


def train(out: str | Path, steps: int = 300, batch_size: int = 32, lr: float = 1e-3, seed: int = 0) -> dict[str, float]:
    """Train the classifier, save it (with its tokenizer) to `out`, and return its held-out accuracy and
    the scores of two hand-written replies (with and without "!")."""
    from grpokit.common.models import load_tokenizer

    tokenizer = load_tokenizer("smollm2-135m")
    tokenizer.padding_side = "right"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model, rng, words = build_model(tokenizer, seed), random.Random(seed), word_pool(tokenizer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / steps)  # linear to 0
    model.train()
    for step in range(steps):
        conversations, labels = zip(*(synthetic_example(rng, words) for _ in range(batch_size)))
        batch, target = batch_of(tokenizer, list(conversations), list(labels))
        loss = torch.nn.functional.mse_loss(model(**batch).logits[:, 0], target)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # a spike would collapse it to a constant
        optimizer.step()
        schedule.step()
        if step % 50 == 0 or step == steps - 1:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
    model.eval()
    Path(out).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return evaluate(model, tokenizer, random.Random(seed + 1), words)


@torch.no_grad()
def evaluate(model, tokenizer, rng: random.Random, words: list[str], n: int = 256) -> dict[str, float]:
    """Held-out accuracy (score > 0.5 agrees with the rule) and two natural replies' scores."""
    conversations, labels = zip(*(synthetic_example(rng, words) for _ in range(n)))
    batch, target = batch_of(tokenizer, list(conversations), list(labels))
    scores = model(**batch).logits[:, 0]
    natural = [conversations[0][:2] + [{"role": "assistant", "content": c}] for c in ("What a day!", "What a day.")]
    nat_batch, _ = batch_of(tokenizer, natural, [1.0, 0.0])
    bang, plain = model(**nat_batch).logits[:, 0].tolist()
    return {"accuracy": float(((scores > 0.5).float() == target).float().mean()), "bang": bang, "plain": plain}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="outputs/judges/exclaim-rm", help="folder to save the reward model in")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # a tiny model: one thread is fastest, more only contend
    start = time.monotonic()
    result = train(args.out, args.steps, args.batch_size, args.lr, args.seed)
    print(f"saved {args.out} in {time.monotonic() - start:.0f}s: {result}")


if __name__ == "__main__":
    main()
