"""`grpokit eval`: evaluate a run's weights, the base model, or both side by side, on the same problems.

    grpokit eval --config recipe.yaml --ckpt outputs/run --base --k 8

The recipe is parsed and built as `grpokit orchestrate` does (`make_cli(..., run=False)`): its engine
(`inference`: builtin, vLLM, a `grpokit infer` or any OpenAI-compatible server), its environments and
sampling, and any recipe flag (`--data.eval.max_tokens 64`, `--inference RemoteEngine ...`) overrides as
in fit. The problems are the online eval's (data.eval: its env, seed and max_tokens), sampled through the
same rollout path (grpokit.evaluate.scoring). Weights: grpokit.evaluate.weights. Outputs:
grpokit.evaluate.report; by default `RUN_DIR/eval/<label>.json` and `.md` (with --base only,
`{output_dir}/eval_<time>/`), `<label>-2.json` and so on where an earlier eval holds the name (never
overwritten: the name says which weights, not which eval set).
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path

from grpokit.broadcast.filesystem import FilesystemBroadcast
from grpokit.cli import make_cli
from grpokit.evaluate import report, scoring
from grpokit.evaluate.weights import check_same_model, load_step, pick_step, pipeline_init_from
from grpokit.inference.remote import RemoteError
from grpokit.orchestrator.eval_metrics import ladder
from grpokit.orchestrator.evaluation import EvalSettings, Evaluator
from grpokit.orchestrator.image_prompts import ImagePrompts
from grpokit.orchestrator.rollouts import TurnLimits
from grpokit.run import Startup, start_engine

log = logging.getLogger(__name__)


@dataclass
class EvalOptions:
    """The flags of `grpokit eval` (the rest of the command line is the recipe's)."""

    ckpt: Path | None
    step: int | None
    base: bool
    k: int
    pass_at: list[int]
    temperature: float | None
    num_examples: int
    split: str
    threshold: float
    greedy: bool
    seed: int | None
    out: Path | None
    chunk: int
    resamples: int
    level: float

    def check(self) -> None:
        """Bad combinations, each refused with the fix, before anything is built."""
        if self.ckpt is None and not self.base:
            raise ValueError(
                "grpokit eval: pass --ckpt RUN_DIR (a run's weights), --base (the recipe's model), or both"
            )
        if self.step is not None and self.ckpt is None:
            raise ValueError(f"--step {self.step} picks a step of a run: pass the run's folder with --ckpt RUN_DIR")
        if self.k < 1 or self.chunk < 1 or self.resamples < 1 or not 0 < self.level < 1:
            raise ValueError("--k, --chunk and --resamples must be >= 1 and --level in (0, 1)")
        if self.num_examples < 1 and self.num_examples != -1:
            raise ValueError(f"--num_examples must be >= 1, or -1 for every example, got {self.num_examples}")
        if too_many := [k for k in self.pass_at if k > self.k or k < 1]:
            raise ValueError(
                f"--pass_at {','.join(map(str, too_many))}: pass@k needs 1 <= k <= the samples drawn per problem "
                f"(--k {self.k}); raise --k to {max(too_many)} or drop them from --pass_at"
            )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="grpokit eval",
        allow_abbrev=False,  # --ckpt must not swallow the recipe's --ckpt.interval
        description="Evaluate a run's weights, the base model, or both, on the recipe's eval problems. "
        "Every other flag is the recipe's (--config recipe.yaml, --data.eval.max_tokens 64, --inference ...).",
    )
    p.add_argument("--ckpt", type=Path, help="a run folder (output_dir/run_name) whose weights to evaluate")
    p.add_argument("--step", type=int, help="the run's step to evaluate (default: the newest with weights)")
    p.add_argument("--base", action="store_true", help="evaluate the recipe's model as it is (beside --ckpt)")
    p.add_argument("--k", type=int, default=8, help="samples per problem (pass@k for k = 1, 2, 4, ..., k)")
    p.add_argument("--pass_at", "--pass-at", default="", help="the k of pass@k, comma-separated (default 1,2,4,..,k)")
    p.add_argument("--temperature", type=float, help="sampling temperature (default: the recipe's eval one; see docs)")
    p.add_argument("--num_examples", "--num-examples", type=int, default=-1, help="problems (-1: every one)")
    p.add_argument("--split", choices=("eval", "train"), default="eval", help="data.eval.env's problems, or data.env's")
    p.add_argument("--threshold", type=float, default=1.0, help="reward >= this counts as correct (pass@k, maj@k)")
    p.add_argument("--no_greedy", "--no-greedy", dest="greedy", action="store_false", help="skip the greedy sample")
    p.add_argument("--seed", type=int, help="seed of the problems, sampling and bootstrap (default data.eval.seed)")
    p.add_argument("--out", type=Path, help="the JSON to write, replacing any there (the markdown goes beside it)")
    p.add_argument("--chunk", type=int, default=64, help="problems sampled per engine stream (progress steps)")
    p.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples")
    p.add_argument("--level", type=float, default=0.95, help="confidence level of the intervals")
    return p


def parse_options(argv: list[str]) -> tuple[EvalOptions, list[str]]:
    """(eval's options, the recipe's arguments)."""
    args, recipe_args = parser().parse_known_args(argv)
    try:
        pass_at = sorted({int(k) for k in args.pass_at.split(",") if k.strip()})
    except ValueError:
        raise ValueError(f"--pass_at {args.pass_at!r}: give k values as comma-separated integers, e.g. 1,4,8") from None
    options = EvalOptions(**{**vars(args), "pass_at": pass_at or ladder(args.k)})
    options.check()
    return options, recipe_args


def eval_settings(recipe: EvalSettings | None, options: EvalOptions, training_temperature: float | None):
    """data.eval with eval's flags: every example asked for, k samples, the temperature. The recipe's
    eval temperature is kept unless it is 0 (greedy) while k > 1: k greedy samples are one sample k times,
    so the training sampling's temperature is used (the greedy sample is drawn apart, see --no_greedy)."""
    recipe = recipe or EvalSettings()
    temperature = options.temperature
    if temperature is None:
        temperature = recipe.temperature if recipe.temperature > 0 or options.k == 1 else training_temperature or 1.0
    return replace(
        recipe,
        num_examples=options.num_examples,
        rollouts_per_example=options.k,
        temperature=temperature,
        seed=recipe.seed if options.seed is None else options.seed,
        pass_threshold=options.threshold,
    )


def eval_main(argv: list[str], startup: Startup | None = None) -> int:
    """Run `grpokit eval` (argv without the command's name)."""
    startup = startup or Startup(role="eval")
    options, recipe_args = parse_options(argv)
    run_dir = options.ckpt.resolve() if options.ckpt else None
    step = pick_step(run_dir, options.step) if run_dir else None
    # the eval's own folder (outputs, a checkpoint's scratch weights): RUN_DIR/eval, or a new one
    where = (
        ["--output_dir", str(run_dir), "--run_name", "eval"]
        if run_dir
        else ["--run_name", time.strftime("eval_%Y%m%d-%H%M%S")]
    )
    first = pipeline_init_from(run_dir) if run_dir else []  # a pipeline recipe's SFT run, as the run had it
    cli = make_cli([*first, *recipe_args, *where], run=False, role="eval", startup=startup)
    if run_dir:
        check_same_model(run_dir, cli.model.base_model, cli.model.init_from)
    data, engine = cli.datamodule, cli.config_init["inference"]
    settings = eval_settings(data.settings.eval_settings, options, data.settings.sampling.temperature)
    if run_dir and options.base and samples_served_weights(engine):
        raise ValueError(
            "--base with --ckpt needs an engine that loads weights itself: a server engine serves the weights "
            "its server loaded; evaluate each in a command of its own"
        )
    tokenizer = start_engine(engine, FilesystemBroadcast(), cli.model, run_dir or cli.run.run_dir, data)
    turns = TurnLimits(data.settings.max_turns, data.settings.seq_len, data.settings.pixel_budget)  # as the loop's
    envs = problem_envs(data, tokenizer, options)
    images = ImagePrompts.for_envs(tokenizer, envs, engine=engine, budget=data.settings.pixel_budget)
    evaluator = Evaluator(settings, envs, data.settings.sampling, cli.run.run_dir, turns=turns, images=images)
    startup.started = True
    models, problems, values = {}, {}, {}
    plan = [("base", None)] * options.base + ([(f"step_{step}", step)] if run_dir else [])
    try:
        for label, weights_step in plan:
            load_weights(engine, run_dir, weights_step, cli.model, cli.run.run_dir / "weights")
            problems[label] = play(evaluator, engine, tokenizer, options, label)
            values[label] = scoring.per_problem_values(problems[label], options.pass_at, options.threshold)
            models[label] = {
                "weights": "base model" if weights_step is None else f"{run_dir} step {weights_step}",
                "weight_step": engine.weight_step,
                "metrics": scoring.summarise(values[label], settings.seed, options.resamples, options.level),
            }
    finally:
        engine.close()
    return write_outputs(options, settings, evaluator, models, problems, values, cli.run.run_dir, cli.model.model_name)


def problem_envs(data, tokenizer, options: EvalOptions) -> list:
    """The environments of --split (data.eval.env, else the training ones; or data.env), loaded once;
    more problems asked for than they hold is an error (the seeded order would repeat problems)."""
    inputs = data.prepare(tokenizer)
    envs = inputs.training if options.split == "train" else inputs.evaluation or inputs.training
    if options.num_examples > (available := sum(len(env.examples) for env in envs)):
        raise ValueError(
            f"--num_examples {options.num_examples}: the {options.split} split has {available} problems; "
            "ask for at most that many, or -1 for all"
        )
    return envs


def samples_served_weights(engine) -> bool:
    """The engine samples with whatever its servers loaded (RemoteEngine in front of `grpokit infer`, which
    follows the run's broadcast), rather than putting the step's weights there itself (the builtin engine;
    VLLMEngine, which hot-loads the step's adapter: `pushes_weights`)."""
    return engine.servers_load_weights and not getattr(engine, "pushes_weights", False)


def load_weights(engine, run_dir: Path | None, step: int | None, policy, scratch: Path) -> None:
    """Put step `step`'s weights into the engine (None: keep the base model it was set up with). A server
    engine that samples what its servers loaded checks they hold that step (the base model: step <= 0)."""
    if samples_served_weights(engine):
        check_served_step(engine, step)
    if step is not None:
        engine.load_weights(load_step(run_dir, step, policy, scratch))


def check_served_step(engine, step: int | None) -> None:
    """Ask the servers for `step` (a `grpokit infer` following the run loads the newest up to it) and refuse
    other weights. A server without grpokit's GET /v1/weights (vLLM, any OpenAI-compatible server) cannot be
    asked for a step: it serves its model as the base model, and a step is refused with the fix."""
    if hasattr(engine, "pin_weights"):  # each request asks for weights up to this step, never newer
        engine.pin_weights = True
    wanted = "the base model" if step is None else f"step {step}"
    try:
        served = engine.served_weight_step(step if step is not None else 0)
    except RemoteError as e:
        urls = " ".join(engine.base_urls)
        if e.code == 404 and step is None:
            log.warning("%s is not grpokit's server (no /v1/weights): --base samples the model it serves", urls)
            return
        if e.code == 404:
            raise ValueError(
                f"{urls} is not grpokit's server (no /v1/weights), so it cannot be asked for step {step}: on a "
                "vLLM server started with --enable-lora pass `--inference VLLMEngine` (it loads the step's adapter), "
                "or serve the run with `grpokit infer`"
            ) from e
        if e.code != 409:
            raise
        raise ValueError(  # a server never goes back to older weights
            f"the inference servers already hold newer weights than {wanted}: restart `grpokit infer` to "
            f"evaluate {wanted}, or evaluate the step they hold"
        ) from e
    if served != step and not (step is None and served <= 0):
        raise ValueError(
            f"the inference servers hold step {served}, not {wanted}: serve {wanted} (`grpokit infer` on "
            f"the run loads its broadcast's steps; on no run, the base model) or evaluate --step {served}"
        )


def play(evaluator: Evaluator, engine, tokenizer, options: EvalOptions, label: str) -> list[scoring.Problem]:
    """The problems' k samples and, unless --no_greedy or the samples are greedy already, a greedy one."""
    sampling = evaluator.sampling
    groups = scoring.sample_groups(evaluator, engine, tokenizer, sampling, options.k, options.chunk, label)
    if not options.greedy:
        greedy = None
    elif sampling.temperature == 0:
        greedy = groups  # every sample is the greedy one
    else:
        greedy_sampling = replace(sampling, temperature=0.0)
        greedy = scoring.sample_groups(
            evaluator, engine, tokenizer, greedy_sampling, 1, options.chunk, f"{label} greedy"
        )
    return scoring.problems_of(evaluator, groups, greedy)


def write_outputs(options, settings, evaluator, models, problems, values, eval_dir: Path, model_name: str) -> int:
    """The JSON and markdown report; the markdown also on stdout."""
    labels = list(models)
    comparison = None
    if len(labels) == 2:
        a, b = labels
        diffs = report.compare(values[a], values[b], settings.seed, options.resamples, options.level)
        comparison = {"a": a, "b": b, "envs": diffs}
    described = {
        "model": model_name,
        "k": options.k,
        "pass_at": options.pass_at,
        "temperature": settings.temperature,
        "max_tokens": evaluator.sampling.max_tokens,
        "threshold": options.threshold,
        "split": options.split,
        "problems": len(evaluator.prompts),
        "seed": settings.seed,
        "chunk": options.chunk,
        "resamples": options.resamples,
        "level": options.level,
    }
    doc = report.result(described, models, problems, comparison)
    if options.out:
        json_path, md_path = report.write(doc, options.out)
    else:
        json_path, md_path = report.write_new(doc, eval_dir / f"{'_vs_'.join(labels)}.json")
    print(report.markdown(doc), end="")
    log.info("eval results in %s and %s", json_path, md_path)
    return 0
