"""The weight probe (grpokit.common.weight_probe): the trainer's logprobs of a fixed token sequence,
published with each step (FilesystemBroadcast's probe.json, checksummed), and the rule that finds an
engine still sampling with the step before. The check against a real vLLM server that loads the old
adapter under the new name is in tests/integration/test_vllm_cpu.py."""

import json

import pytest
import torch

from grpokit.broadcast.filesystem import PROBE_FILE, DamagedStepError, FilesystemBroadcast
from grpokit.common.loaded_weights import WeightsNotLoadedError
from grpokit.common.weight_probe import PROBE_LEN, check_probe, probe_ids, trainer_probe
from grpokit.types import WeightUpdate


def test_probe_ids_are_fixed_and_in_the_vocabulary():
    assert probe_ids(49152) == probe_ids(49152) and len(probe_ids(49152)) == PROBE_LEN
    assert max(probe_ids(500)) < 500 and len(set(probe_ids(49152))) == PROBE_LEN


def test_the_trainer_probe_is_the_models_logprobs_in_eval_mode(tiny_model):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).train()
    probe = trainer_probe(model)
    ids = torch.tensor([probe["token_ids"]])
    with torch.no_grad():
        logits = model.eval()(input_ids=ids).logits[0, :-1].double()
    model.train()
    expected = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    assert probe["logprobs"] == pytest.approx(expected.tolist(), abs=1e-5)
    assert model.training  # the mode is given back


def test_an_engine_nearer_the_previous_weights_is_stale():
    before, after = [-1.0] * 8, [-1.5] * 8  # the trainer's step moved the probe by 0.5 a token
    assert check_probe(3, [-1.5 + 1e-3] * 8, after, before, "e") == pytest.approx(1e-3)  # loaded: small error
    with pytest.raises(WeightsNotLoadedError, match="step 3"):
        check_probe(3, [-1.0 + 1e-3] * 8, after, before, "e")  # the old weights' logprobs under the new name
    # a step that moves the probe less than the engine's noise claims nothing, whichever side it lands
    assert check_probe(3, [-1.0 + 0.05] * 8, [-1.0 + 1e-3] * 8, before, "e") > 0
    assert check_probe(0, [-3.0] * 8, after, None, "e") == pytest.approx(1.5)  # a first load: no step before
    with pytest.raises(WeightsNotLoadedError, match="7 logprobs"):
        check_probe(3, [-1.0] * 7, after, before, "e")


def test_the_filesystem_broadcast_carries_the_probe_checked(tmp_path):
    probe = {"token_ids": [5, 6, 7], "logprobs": [-1.25, -2.5]}
    writer = FilesystemBroadcast()
    writer.setup(tmp_path)
    writer.publish(WeightUpdate(step=1, tensors={"w": torch.ones(2)}, probe=probe))
    writer.publish(WeightUpdate(step=2, tensors={"w": torch.ones(2)}))  # no probe: no file
    assert writer.read(1).probe == probe and writer.read(2).probe is None
    assert not (writer.step_dir(2) / PROBE_FILE).exists()
    path = writer.step_dir(1) / PROBE_FILE
    path.write_text(json.dumps({**probe, "logprobs": [-1.25, -2.0]}))  # damaged after it was published
    with pytest.raises(DamagedStepError, match="checksum"):
        writer.read(1)
