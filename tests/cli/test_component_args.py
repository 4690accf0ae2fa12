"""How a recipe names components: a swapped component gets its own defaults (not the settings the
replaced class shared with it), and a misspelt component name fails naming the key and the fix."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from jsonargparse import Namespace

from grpokit.cli.component_args import check_component_names, reset_carried_init_args
from grpokit.main import entry, main

ROOT = Path(__file__).resolve().parents[2]
RECIPE = str(ROOT / "recipes" / "reverse_text.yaml")
CLIPPED_PG = str(ROOT / "recipes" / "ablations" / "clipped_pg.yaml")
GSPO = "grpokit.registry.losses.gspo.GSPO"


def parsed_gspo(eps_low=0.2, eps_high=0.28):
    """The parsed recipe after jsonargparse swapped ClippedPG for GSPO: the shared eps values carried over."""
    return Namespace(
        model=Namespace(loss=Namespace(class_path=GSPO, init_args=Namespace(eps_low=eps_low, eps_high=eps_high)))
    )


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        ([], (3e-4, 4e-4)),  # both carried: GSPO's own defaults
        (["--model.loss.init_args.eps_low", "0.001"], (0.001, 4e-4)),  # given after the swap: kept
        (["--model.loss.eps_low=0.001"], (0.001, 4e-4)),
    ],
)
def test_a_swapped_loss_gets_its_own_defaults_except_what_follows_the_swap(after, expected, capsys):
    low = expected[0] if after else 0.2
    config = parsed_gspo(eps_low=low)
    notes = reset_carried_init_args(
        ["fit", "--config", RECIPE, "--config", CLIPPED_PG, "--model.loss", "GSPO", *after], config
    )
    assert (config.model.loss.init_args.eps_low, config.model.loss.init_args.eps_high) == expected
    assert len(notes) == 1 and "model.loss: GSPO" in notes[0] and "eps_high 0.28 -> 0.0004" in notes[0]
    assert notes[0] in capsys.readouterr().err


def test_a_swap_inside_an_overlay_file_and_no_swap_at_all(tmp_path):
    overlay = tmp_path / "gspo.yaml"
    overlay.write_text(yaml.safe_dump({"model": {"loss": {"class_path": "GSPO", "init_args": {"eps_high": 5e-4}}}}))
    config = parsed_gspo(eps_high=5e-4)
    reset_carried_init_args(["fit", "--config", CLIPPED_PG, "--config", str(overlay)], config)
    assert (config.model.loss.init_args.eps_low, config.model.loss.init_args.eps_high) == (3e-4, 5e-4)

    engine = Namespace(
        inference=Namespace(
            class_path="grpokit.inference.vllm.engine.VLLMEngine",
            init_args=Namespace(serve=Namespace(port=1), timeout=5.0),
        )
    )
    reset_carried_init_args(
        ["fit", "--inference", "BuiltinEngine", "--inference", "VLLMEngine", "--inference.init_args.serve.port", "1"],
        engine,
    )
    assert (
        engine.inference.init_args.serve == Namespace(port=1) and engine.inference.init_args.timeout == 600.0
    )  # a nested key keeps its parent

    config = parsed_gspo()  # the same class named twice is no swap: nothing resets
    assert reset_carried_init_args(["fit", "--model.loss", "GSPO", "--model.loss", GSPO], config) == []
    assert config.model.loss.init_args.eps_low == 0.2


def test_print_config_shows_the_reset_recipe(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--config", RECIPE, "--config", CLIPPED_PG, "--model.loss", "GSPO", "--print_config"])
    assert stop.value.code == 0
    loss = yaml.safe_load(capsys.readouterr().out)["model"]["loss"]
    assert loss == {"class_path": GSPO, "init_args": {"eps_low": 3e-4, "eps_high": 4e-4}}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model.loss", "AIPOO"], "model.loss: no loss is named 'AIPOO' (--model.loss); did you mean AIPO?"),
        (["--data.advantage=GroupNorn"], "did you mean GroupNorm?"),
        (["--data.advantage", "Overlong"], "Overlong is of kind filter, not advantage"),
        (["--data.filters+=Overlog"], "data.filters: no filter is named 'Overlog'"),
        (["--data.filters+=Overlog"], "or give your class's import path (my_lab.filters.MyFilter)"),
        (["--model.loss", "{class_path: GSPOO}"], "no loss is named 'GSPOO'"),
    ],
)
def test_a_misspelt_component_name_names_the_key_and_the_known_names(argv, message):
    with pytest.raises(ValueError, match="grpokit registry list") as e:
        check_component_names(["fit", "--config", RECIPE, *argv])
    assert message in str(e.value)


@pytest.mark.parametrize(
    ("path", "message"),
    [
        (
            "no_such_pkg.losses.Reinforce",
            "model.loss: no_such_pkg.losses.Reinforce (--model.loss): cannot import no_such_pkg.losses "
            "(No module named 'no_such_pkg'); is its package installed or on PYTHONPATH?",
        ),
        (
            "grpokit.registry.losses.gspo.GSPOO",
            "model.loss: grpokit.registry.losses.gspo.GSPOO (--model.loss): grpokit.registry.losses.gspo "
            "has no 'GSPOO'; did you mean GSPO?",
        ),
        (
            "grpokit.registry.advantages.group_norm.GroupNorm",
            "GroupNorm is not a Loss subclass; model.loss takes a loss (`grpokit registry list loss`",
        ),
    ],
    ids=["no module", "no class", "other kind"],
)
def test_a_class_path_that_does_not_resolve_names_the_key_and_the_cause(path, message):
    """jsonargparse's own message for these is a dozen lines of union alternatives ("Expected a path but
    ... either not accessible or invalid", "Expected a <class 'NoneType'>"); this is one line."""
    with pytest.raises(ValueError) as e:
        check_component_names(["fit", "--config", RECIPE, "--model.loss", path])
    assert message in str(e.value)


def test_a_class_nested_in_a_class_resolves_as_jsonargparse_resolves_it(tmp_path, monkeypatch):
    (tmp_path / "nested_lab.py").write_text(
        "from grpokit.loss import Loss\n\n\nclass Losses:\n    class Plain(Loss):\n"
        "        def __call__(self, inputs):\n            return inputs.trainer_logprobs_T.sum(), {}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    check_component_names(["fit", "--config", RECIPE, "--model.loss", "nested_lab.Losses.Plain"])
    with pytest.raises(ValueError, match="nested_lab.Losses has no 'Plian'; did you mean Plain"):
        check_component_names(["fit", "--config", RECIPE, "--model.loss", "nested_lab.Losses.Plian"])


def test_names_in_recipe_files_are_checked_and_good_ones_pass(tmp_path):
    check_component_names(
        [
            "fit",
            "--config",
            RECIPE,
            "--config",
            CLIPPED_PG,
            "--model.loss",
            "GSPO",
            "--data.advantage",
            "grpokit.registry.advantages.group_norm.GroupNorm",
        ]
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            {"data": {"filters": [{"class_path": "Overlong"}, {"class_path": "ZeroStd"}, {"class_path": "Typo"}]}}
        )
    )
    with pytest.raises(ValueError, match=f"data.filters: no filter is named 'Typo' \\(--config {bad}\\)"):
        check_component_names(["fit", "--config", str(bad)])


def test_the_command_line_lists_every_command_and_refuses_an_unknown_one(capsys):
    # the listing and the unknown command through `entry` (what `python -m grpokit` runs) in this process;
    # one real process (each start imports Lightning for ~5 s) checks the exit code and stderr end to end
    assert entry(["--help"]) == 0
    shown = capsys.readouterr()
    assert all(c in shown.out for c in ("fit", "train", "orchestrate", "infer", "registry", "bench", "sweep"))
    assert entry(["trian"]) == 2
    assert "unknown command 'trian'" in capsys.readouterr().err
    bad = subprocess.run(
        [sys.executable, "-m", "grpokit", "fit", "--config", RECIPE, "--model.loss", "AIPOO"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert (
        bad.returncode == 2
        and "grpokit: error: model.loss: no loss is named 'AIPOO'" in bad.stderr
        and "Traceback" not in bad.stderr
    )


def test_a_list_given_again_resets_each_swapped_element_and_appends_start_fresh(capsys):
    overlong = "grpokit.registry.filters.overlong.Overlong"
    zero_std = "grpokit.registry.filters.zero_std.ZeroStd"
    config = Namespace(data=Namespace(filters=[Namespace(class_path=zero_std, init_args=Namespace(enforce=True))]))
    notes = reset_carried_init_args(
        ["fit", "--config", RECIPE, "--data.filters", "[{class_path: ZeroStd}]"], config
    )  # the recipe's [0] is Overlong(enforce: true)
    assert config.data.filters[0].init_args.enforce is False and "data.filters[0]: ZeroStd" in notes[0]

    kept = Namespace(
        data=Namespace(
            filters=[
                Namespace(class_path=overlong, init_args=Namespace(enforce=True)),
                Namespace(class_path=zero_std, init_args=Namespace(enforce=True)),
            ]
        )
    )
    assert (
        reset_carried_init_args(
            ["fit", "--config", RECIPE, "--data.filters+={class_path: ZeroStd, init_args: {enforce: true}}"], kept
        )
        == []
    )
    assert [f.init_args.enforce for f in kept.data.filters] == [
        True,
        True,
    ]  # appended with its own settings; [0] untouched
