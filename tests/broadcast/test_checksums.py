"""What the engine samples with is what the trainer published: FilesystemBroadcast checks each file it
reads against the checksum the writer put in STABLE (a damaged file is refused naming the file and the
step), and after every load the engine's weights are compared with the update (grpokit.common.loaded_weights):
a real BuiltinEngine whose load was skipped, or that loaded other weights, stops the run naming the step
and the broadcast."""

import json
import logging
import re

import pytest
import torch

from grpokit.broadcast import filesystem
from grpokit.broadcast.filesystem import (
    ADAPTER_CONFIG,
    ADAPTER_FILE,
    FULL_FILE,
    STABLE,
    DamagedStepError,
    FilesystemBroadcast,
)
from grpokit.common.loaded_weights import WeightsNotLoadedError, check_loaded
from grpokit.inference.builtin import BuiltinEngine
from grpokit.inference.server.generation import RequestSampler
from grpokit.orchestrator.weights import WeightSchedule
from grpokit.types import WeightUpdate
from tests.support.lora import tiny_lora_update


def flip_near_end(path, count: int = 1000) -> None:
    data = path.read_bytes()
    count = min(count, len(data) // 2)
    path.write_bytes(data[:-count] + bytes(b ^ 0xFF for b in data[-count:]))


def broadcast(tmp_path) -> FilesystemBroadcast:
    b = FilesystemBroadcast()
    b.setup(tmp_path)
    return b


def full_update(step: int) -> WeightUpdate:
    g = torch.Generator().manual_seed(step)
    return WeightUpdate(step=step, tensors={"w": torch.randn(64, 64, generator=g), "b": torch.randn(64, generator=g)})


def test_stable_holds_the_checksum_of_every_file(tmp_path):
    b = broadcast(tmp_path)
    b.publish(tiny_lora_update(0))
    marker = json.loads((b.step_dir(0) / STABLE).read_text())
    assert marker["step"] == 0 and sorted(marker["checksums"]) == [ADAPTER_CONFIG, ADAPTER_FILE]
    assert all(v.startswith("crc32:") for v in marker["checksums"].values())


@pytest.mark.parametrize("lora", [True, False], ids=["adapter", "full"])
def test_a_weights_file_with_bytes_flipped_near_its_end_is_refused_naming_it_and_the_step(tmp_path, lora):
    b = broadcast(tmp_path)
    make = tiny_lora_update if lora else full_update
    b.publish(make(0))
    b.publish(make(1))
    path = b.step_dir(1) / (ADAPTER_FILE if lora else FULL_FILE)
    flip_near_end(path)
    with pytest.raises(
        DamagedStepError,
        match=rf"FilesystemBroadcast step 1: {re.escape(str(path))} is not what the trainer published "
        r"\(checksum crc32:\w+, published crc32:\w+\).*not loaded",
    ):
        b.poll(0)
    assert b.read(0).step == 0  # the other steps stay readable


def test_an_adapter_config_changed_in_place_is_refused(tmp_path):
    b = broadcast(tmp_path)
    b.publish(tiny_lora_update(0))
    config = b.step_dir(0) / ADAPTER_CONFIG
    config.write_text(config.read_text().replace('"r": 4', '"r": 5'))  # still JSON, still loadable
    with pytest.raises(DamagedStepError, match=rf"step 0: {re.escape(str(config))} is not what the trainer"):
        b.read(0)


def test_a_damaged_stable_marker_is_refused(tmp_path):
    b = broadcast(tmp_path)
    b.publish(tiny_lora_update(0))
    (b.step_dir(0) / STABLE).write_text('{"step": 0, "checks')
    with pytest.raises(DamagedStepError, match="STABLE is damaged"):
        b.read(0)


def test_a_step_of_an_older_grpokit_is_read_unchecked_with_one_warning(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(filesystem, "_warned_unchecked", False)
    b = broadcast(tmp_path)
    b.publish(tiny_lora_update(0))
    (b.step_dir(0) / STABLE).write_text("0")  # what grpokit wrote before 2026-11-29
    with caplog.at_level(logging.WARNING, logger="grpokit.broadcast.filesystem"):
        assert b.read(0).step == 0
        b.read(0)
    assert [r.getMessage() for r in caplog.records] == [
        "broadcast step 0 was written by grpokit before 2026-11-29: read without checksums"
    ]


@pytest.fixture(scope="module")
def engine(tiny_model):
    e = BuiltinEngine(device="cpu")
    e.setup(tiny_model)
    yield e
    e.close()


def schedule(engine, b) -> WeightSchedule:
    return WeightSchedule(engine, b, 0, 1, True, timeout=5, timeout_key="data.weights_timeout")


def test_an_engine_that_loads_each_update_passes_the_check(engine, tmp_path):
    b = broadcast(tmp_path)
    for step in (engine.weight_step + 1, engine.weight_step + 2):
        b.publish(tiny_lora_update(step, scale=step + 1))
        assert schedule(engine, b).poll(step)


def test_an_engine_whose_load_was_skipped_stops_the_run_naming_the_step(engine, tmp_path):
    b = broadcast(tmp_path)
    held = engine.weight_step + 1
    b.publish(tiny_lora_update(held, scale=3.0))
    assert schedule(engine, b).poll(held)  # an adapter of its own, loaded and checked
    step = held + 1
    b.publish(tiny_lora_update(step, scale=7.0))

    def skip(update):  # the engine says it holds the step, its weights are the old ones
        engine.weight_step = update.step

    with pytest.raises(
        WeightsNotLoadedError,
        match=rf"the engine did not load the weights of step {step} from FilesystemBroadcast \(.*step_{step}\): "
        r"its 'base_model\.model\..*lora_A\.weight' differs from the published one.*stopping",
    ):
        schedule(engine, b).poll(step, skip)


def test_an_engine_that_loaded_other_weights_is_caught(engine):
    engine.load_weights(tiny_lora_update(90, scale=2.0))  # another step's adapter...
    published = tiny_lora_update(91, scale=5.0)
    engine.weight_step = 91  # ...held as step 91
    with pytest.raises(WeightsNotLoadedError, match="step 91 from FilesystemBroadcast: its .* differs"):
        check_loaded(engine, published, "FilesystemBroadcast")


def test_a_full_update_whose_names_the_engine_lacks_is_caught(tiny_model, tmp_path):
    """A full update's load_state_dict(strict=False) ignores names the model lacks: loaded nothing."""
    e = BuiltinEngine(device="cpu")
    e.setup(tiny_model)
    tensors = {f"renamed.{k}": v + 1 for k, v in e.model.state_dict().items()}
    update = WeightUpdate(step=0, tensors=tensors)
    e.load_weights(update)
    with pytest.raises(WeightsNotLoadedError, match=r"its 'renamed\..*' is not a weight of the engine's model"):
        check_loaded(e, update, "FilesystemBroadcast")
    good = WeightUpdate(step=1, tensors={k: v + 1 for k, v in e.model.state_dict().items()})
    e.load_weights(good)
    check_loaded(e, good, "FilesystemBroadcast")  # every name loaded: passes


def test_the_servers_load_is_checked_too(tiny_model, tmp_path):
    """`grpokit infer`: a load that did not take stops the request with the step, not a silent serve-on."""
    e = BuiltinEngine(device="cpu")
    e.setup(tiny_model)
    b = broadcast(tmp_path)
    b.publish(tiny_lora_update(0, scale=1.0))
    sampler = RequestSampler(e, e.tokenizer, b, None, None, None)
    sampler.load_newer_weights()
    assert e.weight_step == 0
    b.publish(tiny_lora_update(1, scale=4.0))
    real = e.load_weights
    e.load_weights = lambda update: real(tiny_lora_update(update.step, scale=1.0))  # loads other weights
    with pytest.raises(RuntimeError, match="the engine did not load the weights of step 1 from FilesystemBroadcast"):
        sampler.load_newer_weights()
