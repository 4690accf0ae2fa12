"""Sweep files: grid order, explicit runs crossed with the grid, run names, overlays, and the errors."""

import pytest
import yaml

from grpokit.sweep.spec import SweepError, is_seed_key, load_sweep, nest


def sweep_file(tmp_path, content: dict, name: str = "ablation.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(content, sort_keys=False))
    return path


def test_grid_is_every_combination_first_axis_slowest(tmp_path):
    spec = load_sweep(
        sweep_file(
            tmp_path, {"axes": {"model.loss": ["AIPO", "grpokit.registry.losses.gspo.GSPO"], "seed_everything": [0, 1]}}
        )
    )
    assert (
        spec.name == "ablation"
        and spec.max_parallel == 1
        and spec.launcher == {"name": "local"}
        and spec.rollouts is None
    )
    assert [r.overrides for r in spec.runs] == [
        {"model.loss": "AIPO", "seed_everything": 0},
        {"model.loss": "AIPO", "seed_everything": 1},
        {"model.loss": "grpokit.registry.losses.gspo.GSPO", "seed_everything": 0},
        {"model.loss": "grpokit.registry.losses.gspo.GSPO", "seed_everything": 1},
    ]
    assert [r.id for r in spec.runs] == [
        "00-loss=AIPO-seed_everything=0",
        "01-loss=AIPO-seed_everything=1",
        "02-loss=GSPO-seed_everything=0",
        "03-loss=GSPO-seed_everything=1",
    ]


def test_explicit_runs_are_crossed_with_the_grid_and_overlays_name_the_run(tmp_path):
    spec = load_sweep(
        sweep_file(
            tmp_path,
            {
                "name": "mixed",
                "max_parallel": 2,
                "launcher": {"name": "submitit", "timeout_min": 30},
                "runs": [{"config": "recipes/ablations/gspo.yaml"}, {"model.lr": 1.0e-4, "data.seed": 3}],
                "axes": {"data.sampling.seed": [0, 1]},
            },
        )
    )
    assert spec.name == "mixed" and spec.max_parallel == 2 and spec.launcher == {"name": "submitit", "timeout_min": 30}
    assert [(r.overlays, r.overrides) for r in spec.runs] == [
        (("recipes/ablations/gspo.yaml",), {"data.sampling.seed": 0}),
        (("recipes/ablations/gspo.yaml",), {"data.sampling.seed": 1}),
        ((), {"model.lr": 1.0e-4, "data.seed": 3, "data.sampling.seed": 0}),
        ((), {"model.lr": 1.0e-4, "data.seed": 3, "data.sampling.seed": 1}),
    ]
    # two keys end in "seed": both are named in full
    assert spec.runs[0].id == "00-gspo-seed=0"
    assert spec.runs[2].id == "02-lr=0.0001-data.seed=3-data.sampling.seed=0"


@pytest.mark.parametrize(
    "content, message",
    [
        ({"axes": {"model.lr": [1e-4]}, "model.lr": 1e-4}, "unknown sweep key"),
        ({"axes": {"model.lr": []}}, "non-empty list"),
        ({"axes": {"model.lr": 1e-4}}, "non-empty list"),
        ({"runs": {"model.lr": 1e-4}}, "runs is a list"),
        ({"name": "empty"}, "no runs"),
        ({"axes": {"model.lr": [1e-4]}, "runs": [{"model.lr": 3e-4}]}, r"\['model.lr'\] are set both"),
        ({"axes": {"model.lr": [1e-4]}, "max_parallel": 0}, "max_parallel must be an integer >= 1"),
        ({"axes": {"model.lr": [1e-4]}, "launcher": {"timeout_min": 3}}, "launcher needs a name"),
        ({"axes": {"model.lr": [1e-4]}, "name": "../../x"}, r"name '../../x' must be one plain folder name"),
        ({"axes": {"model.lr": [1e-4]}, "name": "/tmp/x"}, r"name '/tmp/x' must be one plain folder name"),
        ({"axes": {"model.lr": [1e-4]}, "name": ".."}, r"name '..' must be one plain folder name"),
        ({"axes": {"model.lr": [1e-4]}, "name": "n" * 300}, r"must be one plain folder name of at most 100"),
        ({"axes": {"run_name": ["a", "b"]}}, r"\['run_name'\] cannot be an axis or a runs: key"),
        ({"runs": [{"output_dir": "/tmp/elsewhere"}]}, r"\['output_dir'\] cannot be an axis or a runs: key"),
    ],
)
def test_errors_name_the_sweep_key(tmp_path, content, message):
    with pytest.raises(SweepError, match=message):
        load_sweep(sweep_file(tmp_path, content))


def test_missing_file_is_named(tmp_path):
    with pytest.raises(SweepError, match="no such file"):
        load_sweep(tmp_path / "nope.yaml")


def test_nest_builds_a_recipe_overlay():
    assert nest({"model.loss": "GSPO", "model.lr": 0.1, "seed_everything": 2}) == {
        "model": {"loss": "GSPO", "lr": 0.1},
        "seed_everything": 2,
    }
    with pytest.raises(SweepError, match="sets inside 'loss'"):
        nest({"model.loss": "GSPO", "model.loss.init_args.eps_low": 0.1})


def test_seed_keys():
    assert all(map(is_seed_key, ["seed_everything", "data.seed", "data.sampling.seed"]))
    assert not any(map(is_seed_key, ["model.loss", "data.seed_policy_x"]))
