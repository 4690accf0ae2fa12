"""The weight probe: the trainer's logprobs of one fixed token sequence, published with each step, against
the engine's logprobs of it once the engine has loaded that step. For engines that cannot show their
tensors (vLLM: grpokit.common.loaded_weights compares tensors where it can), it is the proof that the
engine samples with the new weights (the failure of verl#7495, ms-swift#9855, unsloth#8701: an adapter
that never reached the engine, while every metric called the weights new).

The probe is PROBE_LEN token ids fixed by the vocabulary size (`probe_ids`), published with the logprobs
(`{"token_ids", "logprobs"}`), so the engine needs neither a tokenizer nor the vocabulary to ask for
them; a logprob is log p(token t+1 | tokens ..t) at temperature 1 (the raw model distribution),
PROBE_LEN - 1 of them.

`check_probe` compares the engine's logprobs e with the trainer's of this step (t) and of the step the
engine held before (t0), by mean absolute difference:
- `error` = mean|e - t| is returned, for the log and the metric (float32 engines: ~1e-6; bf16: ~1e-2);
- the engine is **stale** when it is much nearer the previous weights than the new ones: mean|e - t| >
  STALE_RATIO x mean|e - t0| and mean|e - t| > MIN_GAP. Being scale-free, the rule holds at any
  precision: when a step moves the probe less than the engine's rounding noise, both distances are
  noise and nothing is claimed. A stale engine stops the run with a WeightsNotLoadedError naming the step.
"""

from __future__ import annotations

import torch

from grpokit.common.loaded_weights import WeightsNotLoadedError

PROBE_LEN = 24
PROBE_VOCAB = 10_000  # ids below this: every tokenizer grpokit trains with has at least this many tokens
STALE_RATIO = 4.0
MIN_GAP = 1e-4


def probe_ids(vocab_size: int) -> list[int]:
    """The probe's token ids: a fixed pseudo-random walk over the first min(vocab_size, PROBE_VOCAB) ids."""
    span = min(vocab_size, PROBE_VOCAB)
    return [(17 + 7919 * i) % span for i in range(PROBE_LEN)]


@torch.no_grad()
def trainer_probe(model: torch.nn.Module) -> dict[str, list]:
    """The probe as published: `{"token_ids", "logprobs"}`, the model's logprobs of the probe's tokens
    (eval mode for the forward: no dropout; the mode is restored)."""
    vocab = model.get_output_embeddings().weight.shape[0]
    ids = torch.tensor([probe_ids(vocab)], device=next(model.parameters()).device)
    training = model.training
    model.eval()
    try:
        logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
    finally:
        model.train(training)
    logprobs = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    return {"token_ids": ids[0].tolist(), "logprobs": [float(x) for x in logprobs]}


def mean_abs(a: list[float], b: list[float]) -> float:
    return sum(abs(x - y) for x, y in zip(a, b)) / max(len(a), 1)


def check_probe(
    step: int, engine: list[float], trainer: list[float], previous: list[float] | None, where: str
) -> float:
    """The engine's probe error against the trainer's (mean|e - t|); WeightsNotLoadedError when the engine
    is stale (see the module docstring). `previous`: the trainer's probe of the step the engine held
    before (None at its first load); `where` names the engine."""
    if len(engine) != len(trainer):
        raise WeightsNotLoadedError(f"{where}: step {step}'s probe has {len(engine)} logprobs, expected {len(trainer)}")
    error = mean_abs(engine, trainer)
    if previous is not None:
        before = mean_abs(engine, previous)
        if error > MIN_GAP and error > STALE_RATIO * before:
            raise WeightsNotLoadedError(
                f"{where} does not sample with the weights of step {step}: its logprobs of the weight probe are "
                f"{before:.2e} from the previous step's and {error:.2e} from step {step}'s (mean absolute "
                "difference), so the update did not reach the engine; the run stops rather than train on samples "
                "every metric would call new"
            )
    return error
