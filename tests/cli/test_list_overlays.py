"""A list given again (an overlay file's or a flag's `data.env`, `data.eval.env`, `data.filters`) replaces
the earlier list whole, through the real recipe parser (grpokit.cli.env_args, grpokit.cli.component_args):
jsonargparse alone merges two lists of one length entry by entry, so a new environment inherited the
recipe's environment's args."""

import pytest
import yaml

from grpokit.environments.environment import Environment, EnvSpec
from grpokit.main import main

DEFAULTS = {"args": {}, "name": None, "ratio": None, "env_args": {}, "judge": None}


def parsed(argv: list[str], capsys) -> tuple[dict, str]:
    """The recipe `grpokit fit ARGV --print_config` prints, and what it said on stderr."""
    with pytest.raises(SystemExit) as stop:
        main(["fit", *argv, "--print_config"])
    assert stop.value.code == 0
    out = capsys.readouterr()
    return yaml.safe_load(out.out), out.err


@pytest.fixture
def recipe(tmp_path):
    """A base recipe with one reverse-text environment with args, and a writer of overlays beside it."""
    base = tmp_path / "base.yaml"
    base.write_text("data:\n  env: [{id: reverse-text, args: {min_words: 1}}]\n")

    def overlay(text: str) -> str:
        path = tmp_path / f"overlay_{len(list(tmp_path.iterdir()))}.yaml"
        path.write_text(text)
        return str(path)

    return str(base), overlay


def test_an_overlays_environment_list_replaces_the_recipes(recipe, capsys):
    base, overlay = recipe
    config, err = parsed(["--config", base, "--config", overlay("data:\n  env: [{id: arithmetic}]\n")], capsys)
    assert config["data"]["env"] == [{"id": "arithmetic", **DEFAULTS}]  # min_words used to carry over
    assert "data.env[0]: 'arithmetic'" in err and "min_words" in err
    Environment(EnvSpec(**config["data"]["env"][0]))  # builds with its defaults (it refused min_words)


def test_an_overlay_without_data_env_keeps_the_recipes(recipe, capsys):
    base, overlay = recipe
    config, err = parsed(["--config", base, "--config", overlay("data:\n  batch_size: 16\n")], capsys)
    assert config["data"]["env"] == [{"id": "reverse-text", **DEFAULTS, "args": {"min_words": 1}}]
    assert config["data"]["batch_size"] == 16 and "data.env" not in err


def test_an_overlay_entry_keeps_only_what_it_says(recipe, capsys):
    base, overlay = recipe
    text = "data:\n  env: [{id: reverse-text, name: rt}, {id: arithmetic, args: {num_tasks: 5}}]\n"
    config, _ = parsed(["--config", base, "--config", overlay(text)], capsys)
    assert config["data"]["env"] == [
        {"id": "reverse-text", **DEFAULTS, "name": "rt"},  # the same id again: its args are the overlay's too
        {"id": "arithmetic", **DEFAULTS, "args": {"num_tasks": 5}},
    ]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--data.env", "[{id: arithmetic}]"], [{"id": "arithmetic"}]),
        (["--data.env", "[{id: reverse-text}]"], [{"id": "reverse-text"}]),
        (
            ["--data.env", "[{id: arithmetic}]", "--data.env.args", "{num_tasks: 5}"],
            [{"id": "arithmetic", "args": {"num_tasks": 5}}],
        ),
        (["--data.env+={id: arithmetic}"], [{"id": "reverse-text", "args": {"min_words": 1}}, {"id": "arithmetic"}]),
    ],
)
def test_a_command_line_list_replaces_too_and_an_append_keeps_the_recipes(recipe, capsys, flags, expected):
    base, _ = recipe
    config, _ = parsed(["--config", base, *flags], capsys)
    assert config["data"]["env"] == [{**DEFAULTS, **entry} for entry in expected]


def test_eval_environments_and_filters_are_replaced_the_same_way(recipe, capsys):
    base, overlay = recipe
    first = overlay(
        "data:\n  eval: {env: [{id: reverse-text, args: {min_words: 1}}]}\n"
        "  filters: [{class_path: Overlong, init_args: {enforce: false}}]\n"
    )
    second = overlay("data:\n  eval: {env: [{id: arithmetic}]}\n  filters: [{class_path: Overlong}]\n")
    config, err = parsed(["--config", base, "--config", first, "--config", second], capsys)
    assert config["data"]["eval"]["env"] == [{"id": "arithmetic", **DEFAULTS}]
    assert config["data"]["filters"][0]["init_args"] == {"enforce": True}  # Overlong's default, not false
    assert "data.eval.env[0]" in err and "data.filters[0]: Overlong is in a list given again" in err
    kept, _ = parsed(["--config", base, "--config", first, "--data.filters.init_args.enforce", "true"], capsys)
    assert kept["data"]["filters"][0]["init_args"] == {"enforce": True}  # a flag on the last element
