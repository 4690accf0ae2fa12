"""A pipeline recipe's `sft:` section (grpokit.cli.stages): what `grpokit sft` makes of the file, and where
`grpokit fit` starts from."""

from types import SimpleNamespace

import pytest
import yaml

from grpokit.cli.stages import init_from_sft_stage, sft_stage_argv

PIPELINE = {
    "output_dir": "out",
    "seed_everything": 3,
    "run_name": "grpo",
    "model": {"model": "base/model", "lora": {"rank": 16}, "lr": 5e-4},
    "data": {"env": [{"id": "reverse-text"}], "rollouts_per_example": 8},
    "sft": {
        "run_name": "warm",
        "model": {"lr": 2e-4, "lora": {"rank": 8}},
        "data": {"env": [{"id": "arithmetic", "args": {"num_tasks": 10}}], "answer_field": "answer"},
        "trainer": {"max_steps": 60},
    },
}


def write(path, recipe):
    path.write_text(yaml.safe_dump(recipe))
    return str(path)


def stage_of(argv):
    """The recipe file sft_stage_argv put in argv's --config, parsed."""
    return yaml.safe_load(open(argv[argv.index("--config") + 1]))


def test_the_sft_stage_is_the_section_on_the_shared_top_level_keys(tmp_path):
    argv = sft_stage_argv(["--config", write(tmp_path / "p.yaml", PIPELINE), "--trainer.max_steps", "5"])
    assert argv[0] == "--config" and argv[2:] == ["--trainer.max_steps", "5"]  # later flags still win
    assert stage_of(argv) == {
        "output_dir": "out",
        "seed_everything": 3,
        "model": {"model": "base/model", "lr": 2e-4, "lora": {"rank": 8}},  # fit's lora and lr not carried
        "run_name": "warm",
        "data": {"env": [{"id": "arithmetic", "args": {"num_tasks": 10}}], "answer_field": "answer"},
        "trainer": {"max_steps": 60},
    }


def test_an_overlay_may_hold_the_section_and_lists_replace(tmp_path):
    base = {k: v for k, v in PIPELINE.items() if k != "sft"}
    overlay = {"output_dir": "elsewhere", "sft": {"run_name": "warm", "data": {"env": [{"id": "countdown"}]}}}
    argv = ["--x", "1", "--config", write(tmp_path / "b.yaml", base), f"--config={write(tmp_path / 'o.yaml', overlay)}"]
    argv = sft_stage_argv(argv)
    assert argv[:2] == ["--x", "1"] and argv.count("--config") == 1 and len(argv) == 4
    stage = stage_of(argv)
    assert stage["output_dir"] == "elsewhere" and stage["data"] == {"env": [{"id": "countdown"}]}


def test_files_without_a_section_are_left_to_jsonargparse(tmp_path):
    argv = ["--config", write(tmp_path / "r.yaml", {"model": {"model": "m"}}), "--run_name", "a"]
    assert sft_stage_argv(argv) == argv
    assert sft_stage_argv(["--config", "{model: {model: m}}"]) == ["--config", "{model: {model: m}}"]


def test_the_section_must_name_its_run_and_keep_the_base(tmp_path):
    with pytest.raises(ValueError, match=r"sft.run_name must name the SFT stage's run"):
        sft_stage_argv(["--config", write(tmp_path / "a.yaml", {**PIPELINE, "sft": {"trainer": {"max_steps": 1}}})])
    other = {**PIPELINE, "sft": {"run_name": "warm", "model": {"model": "other/model"}}}
    with pytest.raises(ValueError, match=r"sft.model.model \('other/model'\) differs from model.model"):
        sft_stage_argv(["--config", write(tmp_path / "b.yaml", other)])


def config(tmp_path, init_from=None, sft=None):
    return SimpleNamespace(output_dir=str(tmp_path), model=SimpleNamespace(init_from=init_from), sft=sft)


def test_fit_starts_from_the_finished_sft_run(tmp_path):
    with pytest.raises(ValueError, match=r"names the SFT run .*warm.*has not finished .*--sft null"):
        init_from_sft_stage(config(tmp_path, sft={"run_name": "warm"}))
    (tmp_path / "warm" / "model").mkdir(parents=True)
    c = config(tmp_path, sft={"run_name": "warm"})
    init_from_sft_stage(c)
    assert c.model.init_from == str(tmp_path / "warm")
    explicit = config(tmp_path, init_from="mine", sft={"run_name": "warm"})
    init_from_sft_stage(explicit)
    assert explicit.model.init_from == "mine"  # the recipe's own model.init_from wins
    none = config(tmp_path)  # no section (or --sft null): GRPO from model.model
    init_from_sft_stage(none)
    assert none.model.init_from is None
