"""Broken recipes fail at start with an error naming the file or key and the fix.

Invalid values of known keys (impossible batch arithmetic, negative async level, ...) are
tests/test_config_errors.py and tests/orchestrator/test_batching.py.
"""

import re
from pathlib import Path

import pytest

from grpokit.cli import main, make_cli
from grpokit.env import Environment, EnvSpec
from grpokit.testing import tiny_fit_argv

RECIPE = str(Path(__file__).resolve().parents[2] / "recipes" / "reverse_text.yaml")


def overlay(tmp_path, text: str) -> str:
    path = tmp_path / "overlay.yaml"
    path.write_text(text)
    return str(path)


def test_malformed_yaml_names_the_file_and_line(tmp_path):
    path = overlay(tmp_path, "data:\n  batch_size: [8, 16\n")
    with pytest.raises(ValueError, match=rf'--config {re.escape(path)} is not valid YAML: (.|\n)*in "{re.escape(path)}", line 2, column 15'):
        main(["fit", "--config", RECIPE, "--config", path, "--output_dir", str(tmp_path)])


@pytest.mark.parametrize("text,message", [
    ("data:\n  batch_sise: 8\n", r"Group 'data' does not accept option 'batch_sise'"),
    ("data:\n  batch_size: eight\n", r'Parser key "data.batch_size":(.|\n)*Given value: eight'),
    ("data:\n  sampling:\n    temperature: hot\n", r"data.sampling(.|\n)*temperature(.|\n)*hot"),
], ids=["unknown key", "wrong type", "wrong nested type"])
def test_unknown_keys_and_wrong_types_name_the_key(tmp_path, capsys, text, message):
    with pytest.raises(SystemExit):
        make_cli(["--config", RECIPE, "--config", overlay(tmp_path, text), "--output_dir", str(tmp_path)], run=False)
    assert re.search(message, capsys.readouterr().err), "the error must name the key"


def test_a_missing_model_path_names_model_model(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"cannot load the tokenizer of model '/no/such/model'.*Set model.model to"):
        main(tiny_fit_argv(tmp_path, "/no/such/model", "missing-model", "--trainer.max_steps", "1"))


def test_an_unknown_environment_id_names_data_env_and_the_built_ins():
    with pytest.raises(ValueError, match=r"unknown environment id 'no-such-env' \(data.env\): not a built-in \(\['arithmetic', .*'reverse-text'\]\)"):
        Environment(EnvSpec(id="no-such-env"))


def test_environment_args_the_taskset_rejects_name_data_env():
    with pytest.raises(ValueError, match=r"data.env id 'reverse-text': its taskset does not accept args \{'num_taskz': 3\}(.|\n)*num_taskz"):
        Environment(EnvSpec(id="reverse-text", args={"num_taskz": 3}))
