"""Packed logprobs equal per-sequence logprobs; the engine's logprobs equal the trainer's."""

import torch

from grpokit.common.logprobs import packed_token_logprobs, selective_logprobs
from grpokit.common.models import load_causal_lm
from grpokit.inference import SamplingSettings
from grpokit.inference.builtin import BuiltinEngine
from grpokit.trainer.metrics import mismatch_metrics


def single_logprobs(model, ids):
    logits = model(input_ids=torch.tensor([ids])).logits[0].double()
    return [0.0] + torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1).tolist()


def test_packed_equals_separate(tiny_model):
    model = load_causal_lm(tiny_model).eval()
    seqs = [[5, 17, 300, 2], [9, 8, 7, 6, 5, 4, 3], [42, 43]]
    ids = torch.tensor([t for s in seqs for t in s])
    pos = torch.tensor([i for s in seqs for i in range(len(s))])
    with torch.no_grad():
        packed = packed_token_logprobs(model, ids, pos, torch.tensor([len(s) for s in seqs]))
    expected = [lp for s in seqs for lp in single_logprobs(model, s)]
    assert torch.allclose(packed.double(), torch.tensor(expected, dtype=torch.float64), atol=1e-5)


def test_selective_logprobs_matches_log_softmax():
    logits = torch.randn(6, 50, dtype=torch.float64)
    targets = torch.randint(0, 50, (6,))
    expected = torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1)
    assert torch.allclose(selective_logprobs(logits, targets).double(), expected, atol=1e-6)


def test_engine_logprobs_match_trainer_and_greedy_is_argmax(tiny_model):
    engine = BuiltinEngine(device="cpu")
    engine.setup(tiny_model)
    prompts = [[1, 520, 9531, 198], [1, 4093, 198, 6004, 2, 198, 1, 520]]  # different lengths: left padding
    for temperature in (0.0, 0.7):
        out = engine.generate(prompts, 2, SamplingSettings(temperature=temperature, max_tokens=12, seed=3))
        for prompt, group in zip(prompts, out):
            for c in group:
                ids = prompt + c.token_ids
                with torch.no_grad():
                    trainer = packed_token_logprobs(
                        engine.model,
                        torch.tensor(ids),
                        torch.arange(len(ids)),
                        torch.tensor([len(ids)]),
                        temperature or 1.0,
                    )
                mask = torch.tensor([0.0] * len(prompt) + [1.0] * len(c.token_ids))
                infer = torch.tensor([0.0] * len(prompt) + c.logprobs)
                err = mismatch_metrics(trainer, infer, mask)["token_mult_prob_error"]
                assert float(err) < 1.0 + 1e-4, (temperature, float(err))
        if temperature == 0.0:  # greedy: the two samples of a prompt are identical
            assert out[0][0].token_ids == out[0][1].token_ids


def test_sampling_is_reproducible_with_a_seed(tiny_model):
    def run():
        engine = BuiltinEngine(device="cpu")
        engine.setup(tiny_model)
        return engine.generate([[1, 2, 3]], 3, SamplingSettings(temperature=1.0, max_tokens=8, seed=11))

    a, b = run(), run()
    assert [c.token_ids for c in a[0]] == [c.token_ids for c in b[0]]


def test_packed_entropy_matches_full_softmax(tiny_model):
    model = load_causal_lm(tiny_model).eval()
    ids = torch.tensor([5, 17, 300, 2, 9, 8, 7])
    pos = torch.tensor([0, 1, 2, 3, 0, 1, 2])
    with torch.no_grad():
        logprobs, entropy = packed_token_logprobs(
            model, ids, pos, torch.tensor([4, 3]), temperature=0.7, with_entropy=True
        )
        logits = model(input_ids=ids[None, :4]).logits[0].double() / 0.7
    p = torch.softmax(logits, -1)
    expected = -(p * torch.log(p)).sum(-1)  # entropy of the prediction made at each position
    assert entropy[0] == 0 and entropy[4] == 0  # sequence starts
    assert torch.allclose(entropy[1:4].double(), expected[:3], atol=1e-4)
    assert torch.equal(logprobs, packed_token_logprobs(model, ids, pos, torch.tensor([4, 3]), temperature=0.7))
