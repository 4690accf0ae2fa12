"""RolloutSettings: the `data.*` settings as plain data, checked when built, with the recipe's defaults; the
rollout loop is built from them without a DataModule."""

import dataclasses
import inspect

import pytest

from grpokit.broadcast.filesystem import FilesystemBroadcast
from grpokit.common.models import load_tokenizer
from grpokit.common.run_context import RunContext
from grpokit.environments.environment import EnvSpec
from grpokit.inference import SamplingSettings
from grpokit.inference.remote import RemoteEngine
from grpokit.orchestrator import Orchestrator
from grpokit.orchestrator.batching import BatchShape
from grpokit.orchestrator.loop import RolloutLoop
from grpokit.orchestrator.settings import RolloutSettings, load_inputs
from grpokit.transport.filesystem import FilesystemTransport

pytestmark = pytest.mark.unit

RENAMED = {"env": "env_specs", "eval": "eval_settings"}  # recipe key -> field


def test_the_fields_default_to_the_recipe_keys_defaults():
    """The DataModule's signature is the recipe's (jsonargparse reads it); the dataclass repeats its defaults."""
    fields = {f.name: f for f in dataclasses.fields(RolloutSettings)}
    for name, param in inspect.signature(Orchestrator.__init__).parameters.items():
        field = fields.get(RENAMED.get(name, name))
        if field is None or param.default is None or field.default is dataclasses.MISSING:
            continue  # a null default is the field's default (below); the shape keys are one field
        assert field.default == param.default, name
    built, default = Orchestrator().settings, RolloutSettings()
    assert built.shape == default.shape == BatchShape(32, 8, 1, 1)
    assert (built.env_specs, built.sampling, built.buffer, built.seed) == (
        default.env_specs,
        default.sampling,
        default.buffer,
        default.seed,
    )
    assert type(built.advantage) is type(default.advantage)


def test_building_checks_and_fills_the_sampling_seed():
    assert RolloutSettings(seed=5).sampling.seed == 5
    assert RolloutSettings(seed=5, sampling=SamplingSettings(seed=2)).sampling.seed == 2
    with pytest.raises(ValueError, match=r"data.max_turns must be >= 1 \(assistant turns per rollout\), got 0"):
        RolloutSettings(max_turns=0)
    with pytest.raises(ValueError, match=r"data.max_off_policy_steps \(0\) must be >= data.max_async_level \(1\)"):
        RolloutSettings.from_recipe(max_off_policy_steps=0)
    settings = RolloutSettings.from_recipe(batch_size=8, num_generations=4, steps_per_generation=2)
    assert (settings.batch_size, settings.rollouts_per_example, settings.shape.steps_per_generation) == (8, 4, 2)


def test_a_rollout_loop_is_built_from_the_settings_alone(tmp_path, tiny_model):
    settings = RolloutSettings.from_recipe(
        env=[EnvSpec(id="reverse-text", args={"num_tasks": 4})], batch_size=8, rollouts_per_example=4
    )
    tokenizer = load_tokenizer(tiny_model)
    broadcast, transport = FilesystemBroadcast(), FilesystemTransport()
    broadcast.setup(tmp_path)
    transport.setup(tmp_path)
    run = RunContext(tmp_path, run_name_given=True, start_step=1)
    inputs = load_inputs(settings, tokenizer)
    loop = RolloutLoop(settings, inputs, RemoteEngine(), broadcast, tokenizer, transport, run, max_steps=-1)
    assert loop.settings is settings and loop.envs == inputs.training and loop.start_step == 1
    assert loop.max_steps == 2  # one pass: 4 prompts, 2 a step
