"""A recipe that names both stages of the SFT -> GRPO pipeline, so that

    grpokit sft --config pipeline.yaml
    grpokit fit --config pipeline.yaml

on one file does the whole pipeline. The file's top level is `grpokit fit`'s recipe (GRPO); its `sft:`
section is the SFT stage: `run_name` (required: where the SFT run lives, and what fit starts from) and
the `model`, `data`, `trainer` and `ckpt` keys of `grpokit sft` (docs/sft.md). The SFT stage takes the
top level's `output_dir`, `seed_everything` and `model.model` (one base model for both stages: fit starts
from the SFT run's weights only when their base is its own); what the section sets wins, except a
different `model.model`, which is refused.

- `grpokit sft`: the `--config` files, when one has an `sft:` section, are merged and replaced on the
  command line by their SFT stage (`sft_stage_argv`), written to a temporary recipe file;
  the other flags set the SFT stage's keys (`--trainer.max_steps 5`).
- `grpokit fit` (and train, orchestrate, infer, eval): the parser takes `sft` as a section it does not
  read (`add_sft_section`), and a recipe without `model.init_from` starts from the SFT run,
  `output_dir/sft.run_name` (`init_from_sft_stage`). `--sft null` drops the section: GRPO from the base.

Why an argv rewrite for `grpokit sft` and not one parser: the two stages' `data.*` are different classes
(SFTData, the rollout Orchestrator), so one parser cannot check both; each command parses and checks its
own stage, with the messages and defaults it has without a pipeline file.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import yaml

from grpokit.cli.recipe_files import CONFIG_FLAGS, _flag_positions, read_recipe_file

SECTION = "sft"
SHARED = ("output_dir", "seed_everything")  # the top-level keys both stages use


def add_sft_section(parser) -> None:
    """Let a fit-side parser accept (and keep in the run's config.yaml) a pipeline recipe's `sft:`."""
    parser.add_argument(
        f"--{SECTION}",
        type=dict | None,
        default=None,
        help="The SFT stage of a pipeline recipe, read by `grpokit sft` (docs/sft.md); `grpokit fit` starts "
        "from its run (output_dir/sft.run_name) unless model.init_from is set. null: GRPO from model.model.",
    )


def sft_stage_argv(argv: list[str]) -> list[str]:
    """`argv` (the arguments after `grpokit sft`) with its `--config` files replaced by their SFT stage
    (one temporary recipe file, where the first `--config` was) when one of them has an `sft:` section: the
    files are merged in order first, so an overlay may hold the section (`--config reverse_text --config
    my_sft_stage.yaml`). Without a section, or with a `--config` that is not a file, argv is unchanged."""
    configs = [(at, value) for at, name, value in _flag_positions(argv) if name in CONFIG_FLAGS]
    if not configs or not all(Path(value).is_file() for _, value in configs):
        return list(argv)
    recipes = [read_recipe_file(value) for _, value in configs]
    if not any(isinstance(r, dict) and r.get(SECTION) is not None for r in recipes):
        return list(argv)
    merged: dict = {}
    for recipe in recipes:
        merged = _merged(merged, recipe if isinstance(recipe, dict) else {})
    stage = stage_file(sft_stage(merged, " + ".join(value for _, value in configs)), configs[-1][1])
    drop = set()
    for at, _ in configs:  # the flag and its value: one argument (--config=FILE) or two
        drop.update({at} if argv[at].startswith("-") else {at - 1, at})
    first = min(drop)
    return [*argv[:first], "--config", stage, *(arg for i, arg in enumerate(argv) if i > first and i not in drop)]


def stage_file(stage: dict, source: str) -> str:
    """Write the SFT stage to a temporary `NAME.sft.yaml` (removed when the process exits) and return its
    path: jsonargparse and grpokit's own readers of `--config` files (the list and component resets) then
    read it as any recipe file."""
    folder = Path(tempfile.mkdtemp(prefix="grpokit-sft-stage-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = folder / f"{Path(source).stem}.sft.yaml"
    header = f"# the SFT stage of {source} (its `sft:` section; grpokit.cli.stages)\n"
    path.write_text(header + yaml.safe_dump(stage, sort_keys=False))
    return str(path)


def sft_stage(recipe: dict, path: str) -> dict:
    """The `grpokit sft` recipe of a pipeline recipe (`path`: its file, for the messages)."""
    section = recipe[SECTION]
    if not isinstance(section, dict) or not isinstance(section.get("run_name"), str) or not section["run_name"]:
        raise ValueError(
            f"--config {path}: sft.run_name must name the SFT stage's run (a folder name under output_dir, "
            "e.g. `sft: {run_name: my_sft, ...}`): `grpokit fit` on the same file starts from that run"
        )
    base = (recipe.get("model") or {}).get("model")
    own = (section.get("model") or {}).get("model")
    if base is not None and own is not None and own != base:
        raise ValueError(
            f"--config {path}: sft.model.model ({own!r}) differs from model.model ({base!r}): the GRPO stage "
            "starts from the SFT run only on its own base model; drop sft.model.model (it defaults to model.model)"
        )
    stage = {key: recipe[key] for key in SHARED if key in recipe}
    if base is not None:
        stage["model"] = {"model": base}
    return _merged(stage, section)


def _merged(base: dict, over: dict) -> dict:
    """`over` on top of `base`: mappings merge key by key, anything else (lists included) replaces."""
    out = dict(base)
    for key, value in over.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def init_from_sft_stage(config) -> None:
    """A fit-side recipe with an `sft:` section and no `model.init_from`: start from the SFT run's folder,
    which must then hold a finished SFT run (its model/), or the start is refused naming the fix."""
    section = getattr(config, SECTION, None)
    if not section or config.model.init_from is not None:
        return
    run_name = section.get("run_name") if isinstance(section, dict) else None
    if not isinstance(run_name, str) or not run_name:
        raise ValueError("sft.run_name must name the SFT stage's run (the folder under output_dir fit starts from)")
    run_dir = Path(config.output_dir) / run_name
    if not (run_dir / "model").is_dir():
        raise ValueError(
            f"the recipe's sft section names the SFT run {str(run_dir)!r}, which has not finished (no model/): "
            "run `grpokit sft` with the same --config first, or pass --sft null to start GRPO from model.model"
        )
    config.model.init_from = str(run_dir)
