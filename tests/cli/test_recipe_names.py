"""Shipped recipes by name (`--config reverse_text`, grpokit.cli.recipe_files) and `grpokit recipes` (list, cp)."""

from importlib.resources import files
from pathlib import Path

import pytest

from grpokit.cli.recipe_files import find_recipe, resolve_recipe_names, shipped_recipes
from grpokit.main import entry, main

pytestmark = pytest.mark.unit
SHIPPED = Path(str(files("grpokit.recipes")))


@pytest.mark.parametrize("name", ["reverse_text", "reverse_text.yaml", "recipes/reverse_text.yaml"])
def test_a_name_that_is_no_file_is_the_shipped_recipe(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no recipes/ folder here
    assert resolve_recipe_names(["fit", "--config", name, "--model.lr", "1e-4"]) == [
        "fit",
        "--config",
        str(SHIPPED / "reverse_text.yaml"),
        "--model.lr",
        "1e-4",
    ]


def test_overlays_in_a_subfolder_resolve_in_every_flag_form(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["infer", "--config=reverse_text", "-c", "ablations/gspo", "--config", "ablations/rloo.yaml"]
    assert resolve_recipe_names(argv) == [
        "infer",
        f"--config={SHIPPED / 'reverse_text.yaml'}",
        "-c",
        str(SHIPPED / "ablations" / "gspo.yaml"),
        "--config",
        str(SHIPPED / "ablations" / "rloo.yaml"),
    ]


def test_a_file_that_exists_wins_over_the_shipped_recipe(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reverse_text.yaml").write_text("trainer: {max_steps: 3}\n")
    (tmp_path / "ablations").mkdir()
    (tmp_path / "ablations" / "gspo.yaml").write_text("model: {lr: 1.0e-5}\n")
    argv = ["fit", "--config", "reverse_text.yaml", "--config", "ablations/gspo.yaml", "--config", "reverse_text"]
    assert resolve_recipe_names(argv) == [*argv[:-1], str(SHIPPED / "reverse_text.yaml")]  # no file "reverse_text"


def test_inline_yaml_and_other_flags_are_left_alone():
    argv = ["fit", "--config", "{trainer: {max_steps: 2}}", "--data.env", "reverse_text", "--run_name", "gspo"]
    assert resolve_recipe_names(argv) == argv


def test_an_unknown_name_lists_the_closest_shipped_recipes():
    with pytest.raises(ValueError) as e:
        find_recipe("reverse_txt")
    message = str(e.value)
    assert message.startswith(
        "--config reverse_txt: no such file, and no shipped recipe of that name; did you mean reverse_text, "
    )
    assert "reverse_text_qerl" in message and "arithmetic" not in message
    assert message.endswith("? (`grpokit recipes` lists them with what each does)")
    with pytest.raises(ValueError, match="did you mean ablations/gspo\\?"):
        find_recipe("gspo.yaml")  # an overlay named without its folder


def test_a_name_like_no_recipe_lists_them_all_and_the_command_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GRPOKIT_TRACEBACK", raising=False)
    assert entry(["fit", "--config", "zzzz"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("grpokit: error: --config zzzz: no such file, and no shipped recipe of that name; ")
    assert "the shipped recipes are arithmetic, calculator, " in err and "ablations/gspo" in err, err


def test_shipped_recipes_are_every_yaml_of_the_recipes_folder_by_name():
    repo_recipes = Path(__file__).resolve().parents[2] / "recipes"
    names = {p.relative_to(repo_recipes).with_suffix("").as_posix() for p in repo_recipes.rglob("*.yaml")}
    shipped = shipped_recipes()
    assert set(shipped) == names and {"reverse_text", "ablations/gspo"} <= names
    assert list(shipped)[0] == "arithmetic" and shipped["ablations/gspo"].name == "gspo.yaml"  # base recipes first


def test_grpokit_recipes_lists_each_with_its_first_comment_line(capsys):
    assert main(["recipes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(shipped_recipes())
    by_name = {line.split()[0]: line.split(None, 1)[1] for line in lines}
    first = (SHIPPED / "reverse_text.yaml").read_text().splitlines()[0].lstrip("# ")
    assert by_name["reverse_text"] == first
    assert (
        by_name["ablations/gspo"]
        == "Overlay: GSPO, a sequence-level importance ratio with the paper's narrow clip range."
    )


def test_recipes_cp_copies_to_a_file_or_into_a_folder_and_refuses_to_overwrite(tmp_path, capsys):
    gspo = (SHIPPED / "ablations" / "gspo.yaml").read_text()
    assert main(["recipes", "cp", "ablations/gspo", str(tmp_path / "mine.yaml")]) == 0
    assert (tmp_path / "mine.yaml").read_text() == gspo
    assert main(["recipes", "cp", "reverse_text.yaml", str(tmp_path)]) == 0  # a folder: under its own name
    assert (tmp_path / "reverse_text.yaml").read_text() == (SHIPPED / "reverse_text.yaml").read_text()
    capsys.readouterr()

    (tmp_path / "mine.yaml").write_text("edited\n")
    assert main(["recipes", "cp", "ablations/gspo", str(tmp_path / "mine.yaml")]) == 2
    assert "mine.yaml exists; add --force to overwrite it" in capsys.readouterr().err
    assert (tmp_path / "mine.yaml").read_text() == "edited\n"
    assert main(["recipes", "cp", "ablations/gspo", str(tmp_path / "mine.yaml"), "--force"]) == 0
    assert (tmp_path / "mine.yaml").read_text() == gspo


def test_recipes_cp_of_an_unknown_name_names_the_closest(tmp_path, capsys):
    assert main(["recipes", "cp", "countdwn", str(tmp_path)]) == 2
    assert "did you mean countdown?" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
