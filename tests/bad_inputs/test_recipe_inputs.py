"""Broken recipes fail at start with an error naming the file or key and the fix.

Invalid values of known keys (impossible batch arithmetic, negative async level, ...) are
tests/cli/test_config_errors.py and tests/orchestrator/test_batching.py.
"""

import re
from pathlib import Path

import pytest

from grpokit.cli import make_cli
from grpokit.environments.environment import Environment, EnvSpec
from grpokit.main import entry, main
from grpokit.testing import tiny_fit_argv

RECIPE = str(Path(__file__).resolve().parents[2] / "recipes" / "reverse_text.yaml")


def overlay(tmp_path, text: str) -> str:
    path = tmp_path / "overlay.yaml"
    path.write_text(text)
    return str(path)


def test_malformed_yaml_names_the_file_and_line(tmp_path):
    path = overlay(tmp_path, "data:\n  batch_size: [8, 16\n")
    with pytest.raises(
        ValueError,
        match=rf'--config {re.escape(path)} is not valid YAML: (.|\n)*in "{re.escape(path)}", line 2, column 15',
    ):
        main(["fit", "--config", RECIPE, "--config", path, "--output_dir", str(tmp_path)])


@pytest.mark.parametrize(
    "text,message",
    [
        ("data:\n  batch_sise: 8\n", r"Group 'data' does not accept option 'batch_sise'"),
        ("data:\n  batch_size: eight\n", r'Parser key "data.batch_size":(.|\n)*Given value: eight'),
        ("data:\n  sampling:\n    temperature: hot\n", r"data.sampling(.|\n)*temperature(.|\n)*hot"),
    ],
    ids=["unknown key", "wrong type", "wrong nested type"],
)
def test_unknown_keys_and_wrong_types_name_the_key(tmp_path, capsys, text, message):
    with pytest.raises(SystemExit):
        make_cli(["--config", RECIPE, "--config", overlay(tmp_path, text), "--output_dir", str(tmp_path)], run=False)
    assert re.search(message, capsys.readouterr().err), "the error must name the key"


@pytest.mark.parametrize(
    "args,suggestion",
    [
        (["--data.batch_sise", "8"], "did you mean --data.batch_size (instead of --data.batch_sise)?"),
        (
            ["--model.loss.init_args.token_mask_lo", "0.1"],
            "did you mean token_mask_low or token_mask_high (instead of token_mask_lo)?\nAIPO accepts: adv_tau,",
        ),
    ],
    ids=["recipe key", "component init arg"],
)
def test_a_misspelled_key_gets_a_short_error_with_a_suggestion(tmp_path, capsys, args, suggestion):
    """The error and a "did you mean" from the keys the parser or the component accepts, without the
    ~100 lines of usage jsonargparse prints first."""
    with pytest.raises(SystemExit):
        main(["fit", "--config", RECIPE, "--output_dir", str(tmp_path), *args])
    err = capsys.readouterr().err
    assert suggestion in err and "grpokit fit --help` lists every option" in err, err
    assert "usage:" not in err and len(err.splitlines()) < 20, err


def test_a_misspelled_key_in_a_recipe_file_gets_a_suggestion(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(
            [
                "fit",
                "--config",
                RECIPE,
                "--config",
                overlay(tmp_path, "data:\n  rollouts_per_exampel: 4\n"),
                "--output_dir",
                str(tmp_path),
            ]
        )
    assert "did you mean data.rollouts_per_example (instead of data.rollouts_per_exampel)?" in capsys.readouterr().err


def test_a_missing_model_path_names_model_model(tmp_path):
    with pytest.raises(
        FileNotFoundError, match=r"model.model '/no/such/model': no such folder. Set it to a local model folder"
    ):
        main(tiny_fit_argv(tmp_path, "/no/such/model", "missing-model", "--trainer.max_steps", "1"))


def test_an_unknown_environment_id_names_data_env_and_the_built_ins():
    with pytest.raises(
        ValueError,
        match=r"unknown environment id 'no-such-env' \(data.env\): "
        r"not a built-in \(\['arithmetic', .*'reverse-text', 'shapes'\]\)",
    ):
        Environment(EnvSpec(id="no-such-env"))


def test_environment_args_the_taskset_rejects_name_data_env_and_the_accepted_args():
    with pytest.raises(
        ValueError,
        match=r"data.env id 'reverse-text': bad args \{'num_taskz': 3\}: num_taskz: Extra "
        r"inputs are not permitted \(accepted args: max_words, min_words, num_tasks",
    ):
        Environment(EnvSpec(id="reverse-text", args={"num_taskz": 3}))


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["--model.model", "/no/such/model"], "grpokit: error: model.model '/no/such/model': no such folder"),
        (
            ["--data.env", '[{"id": "revers-text"}]'],
            "grpokit: error: unknown environment id 'revers-text' (data.env): not a built-in",
        ),
        (
            ["--data.env", '[{"id": "reverse-text", "args": {"num_taskz": 3}}]'],
            "grpokit: error: data.env id 'reverse-text': bad args",
        ),
    ],
    ids=["missing model folder", "unknown env id", "bad env args"],
)
def test_the_command_prints_grpokits_own_message_not_the_librarys(tmp_path, capsys, tiny_model, overrides, message):
    """`grpokit` (entry) prints one line: the message grpokit raised, not the innermost library error under it
    (a bare "No module named 'revers_text'", a pydantic dump, an HF repo-id complaint)."""
    argv = tiny_fit_argv(tmp_path, tiny_model, "bad-input", "--trainer.max_steps", "1", *overrides)
    assert entry(argv) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert "Traceback" not in err and "No module named" not in err and "Repo id must be" not in err
    assert not (tmp_path / "bad-input").exists(), "a failed start leaves no empty run folder"
