"""An environment list given again on the command line replaces the recipe's whole: a swapped environment
starts from its own args (grpokit.cli.env_args), also through the real recipe parser. Overlay files:
tests/cli/test_list_overlays.py."""

import pytest

from grpokit.cli.env_args import reset_carried_env_args


@pytest.mark.unit
def test_swapped_environment_drops_the_args_of_the_one_it_replaced(tmp_path, capsys):
    from jsonargparse import Namespace

    recipe = tmp_path / "r.yaml"
    recipe.write_text("data:\n  env:\n    - id: reverse-text\n      args: {min_words: 1}\n")

    def parsed(env_id, args):
        return Namespace(data=Namespace(env=[Namespace(id=env_id, args=dict(args))]))

    swapped = parsed("guess-number", {"min_words": 1})  # what jsonargparse's element merge gives
    notes = reset_carried_env_args(["--config", str(recipe), "--data.env", "[{id: guess-number}]"], swapped)
    assert swapped.data.env[0].args == {} and "guess-number" in notes[0] and "min_words" in capsys.readouterr().err
    kept = parsed("guess-number", {"num_tasks": 5})  # args given with the new id are the user's
    assert not reset_carried_env_args(
        ["--config", str(recipe), "--data.env", "[{id: guess-number, args: {num_tasks: 5}}]"], kept
    )
    assert kept.data.env[0].args == {"num_tasks": 5}
    same = parsed("reverse-text", {"min_words": 1})  # the same id again: the list still replaces the recipe's
    assert reset_carried_env_args(["--config", str(recipe), "--data.env", "[{id: reverse-text}]"], same)
    assert same.data.env[0].args == {}
    named = Namespace(data=Namespace(env=[Namespace(id="guess-number", args={}, name="g", ratio=0.5)]))
    reset_carried_env_args(["--config", str(recipe), "--data.env", "[{id: guess-number}]"], named)
    assert (named.data.env[0].name, named.data.env[0].ratio) == (None, None)  # nothing carries, not only args
    # a verifiers Env's own config (env_args) is dropped the same way when the id changes
    recipe.write_text("data:\n  env:\n    - id: user-sim+reverse-text\n      env_args: {user: {max_turns: 2}}\n")
    paired = Namespace(data=Namespace(env=[Namespace(id="guess-number", args={}, env_args={"user": {"max_turns": 2}})]))
    notes = reset_carried_env_args(["--config", str(recipe), "--data.env", "[{id: guess-number}]"], paired)
    assert paired.data.env[0].env_args == {} and "env_args" in notes[0]


def test_grpokit_prints_the_swapped_environment_without_carried_args(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-m", "grpokit", "fit", "--config", str(repo / "recipes/reverse_text.yaml")]
        + ["--data.env", "[{id: user-sim+reverse-text, env_args: {user: {max_turns: 2}}}]", "--print_config"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "min_words" not in out.stdout and "replaces the earlier list whole" in out.stderr
    assert "user-sim+reverse-text" in out.stdout and "max_turns: 2" in out.stdout  # a verifiers Env's config
