"""`grpokit eval` on a tiny 2-step fit run: the online eval's samples, base vs checkpoint side by side,
a step read from its checkpoint equal to its broadcast, maj@n where a task parses answers, and the bad
inputs as one-line errors."""

import json
import shutil
import sys
from pathlib import Path

import pytest

from grpokit.broadcast.filesystem import FilesystemBroadcast
from grpokit.common.models import load_tokenizer
from grpokit.environments.environment import Environment, EnvSpec
from grpokit.inference import SamplingSettings
from grpokit.inference.builtin import BuiltinEngine
from grpokit.main import SUBCOMMANDS, USAGE, entry, main
from grpokit.orchestrator.evaluation import EvalSettings, Evaluator
from grpokit.orchestrator.rollouts import TurnLimits
from grpokit.testing import build_tiny_model, tiny_fit_argv

ENV = '[{"id": "reverse-text", "args": {"num_tasks": 6}}]'


def recipe(model: str) -> list[str]:
    """The recipe flags the fit ran with (tiny_fit_argv's), without the command and the run folder."""
    argv = tiny_fit_argv("-", model, "-", "--data.env", ENV, "--data.max_async_level", "0")[1:]
    drop = {i + d for i, a in enumerate(argv) if a in ("--output_dir", "--run_name") for d in (0, 1)}
    return [a for i, a in enumerate(argv) if i not in drop]


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_model) -> Path:
    """A 2-step fit with a checkpoint every step: broadcasts/step_0..2, checkpoints/step_1..2."""
    out = tmp_path_factory.mktemp("fit")
    argv = tiny_fit_argv(
        out, tiny_model, "r", "--data.env", ENV, "--data.max_async_level", "0", "--trainer.max_steps", "2",
        "--ckpt.interval", "1", "--data.eval", "null",
    )  # fmt: skip
    assert main(argv) == 0
    return out / "r"


def evaluate(model: str, *flags: str) -> dict:
    out = Path(flags[flags.index("--out") + 1])
    assert main(["eval", *recipe(model), *flags]) == 0
    assert out.with_suffix(".md").read_text().startswith("# grpokit eval")
    return json.loads(out.read_text())


def test_eval_samples_what_the_online_eval_samples(run, tiny_model, tmp_path):
    out = str(tmp_path / "e.json")
    flags = ["--ckpt", str(run), "--step", "2", "--k", "4", "--temperature", "1.0", "--num_examples", "5"]
    doc = evaluate(tiny_model, *flags, "--no_greedy", "--out", out)
    problems = doc["models"]["step_2"]["problems"]
    engine = BuiltinEngine()  # the recipe's engine, holding the broadcast's weights of step 2
    engine.setup(tiny_model)
    reader = FilesystemBroadcast()
    reader.setup(run)
    engine.load_weights(reader.read(2))
    envs = [Environment(EnvSpec(id="reverse-text", args={"num_tasks": 6}))]
    settings = EvalSettings(num_examples=5, rollouts_per_example=4, temperature=1.0)
    # the recipe's data.sampling, with tiny_fit_argv's max_tokens
    sampling = SamplingSettings(temperature=1.0, max_tokens=8)
    evaluator = Evaluator(settings, envs, sampling, tmp_path, turns=TurnLimits(8, 128))
    assert [ex.index for _, ex in evaluator.prompts] == [p["example"] for p in problems]
    groups = evaluator.sample(engine, load_tokenizer(tiny_model))
    assert [[r.reward for r in g] for g in groups] == [p["rewards"] for p in problems]
    online = evaluator.maybe_run(engine, load_tokenizer(tiny_model))  # the online eval's metrics, same samples
    metrics = doc["models"]["step_2"]["metrics"]["reverse-text"]["metrics"]
    for k in (1, 2, 4):
        assert online[f"eval/pass@{k}"] == pytest.approx(metrics[f"pass@{k}"]["mean"], abs=1e-12)
    assert online["eval/reward"] == pytest.approx(metrics["mean@4"]["mean"], abs=1e-12)
    assert online["eval/exact"] == pytest.approx(metrics["env/exact"]["mean"], abs=1e-12)


def test_base_and_checkpoint_side_by_side(run, tiny_model, tmp_path):
    doc = evaluate(tiny_model, "--ckpt", str(run), "--base", "--k", "2", "--out", str(tmp_path / "both.json"))
    assert list(doc["models"]) == ["base", "step_2"]  # the newest step by default
    assert doc["models"]["step_2"]["weight_step"] == 2
    base, trained = (doc["models"][m]["problems"] for m in ("base", "step_2"))
    assert [p["example"] for p in base] == [p["example"] for p in trained] and len(base) == 6  # same problems
    assert all(p["greedy_reward"] is not None and len(p["rewards"]) == 2 for p in base + trained)
    diff = doc["comparison"]["envs"]["reverse-text"]["mean@2"]
    mean = doc["models"]["step_2"]["metrics"]["reverse-text"]["metrics"]["mean@2"]["mean"]
    base_mean = doc["models"]["base"]["metrics"]["reverse-text"]["metrics"]["mean@2"]["mean"]
    assert (
        diff["diff"] == pytest.approx(mean - base_mean, abs=1e-12) and diff["ci_low"] <= diff["diff"] <= diff["ci_high"]
    )
    assert doc["comparison"]["a"] == "base" and doc["comparison"]["b"] == "step_2"
    assert doc["notes"] == []  # reverse-text's tasks parse answers (the stripped reply): maj@2 is reported
    assert "maj@2" in doc["models"]["step_2"]["metrics"]["reverse-text"]["metrics"]
    assert "| step_2 - base |" in (tmp_path / "both.md").read_text()


def test_a_step_without_broadcast_is_read_from_its_checkpoint(run, tiny_model, tmp_path):
    copy = tmp_path / "r"
    shutil.copytree(run, copy)
    shutil.rmtree(copy / "broadcasts" / "step_1")  # pruned, as a long run's early steps are
    flags = ["--step", "1", "--k", "2", "--no_greedy"]
    from_broadcast = evaluate(tiny_model, "--ckpt", str(run), *flags, "--out", str(tmp_path / "a.json"))
    from_checkpoint = evaluate(tiny_model, "--ckpt", str(copy), *flags, "--out", str(tmp_path / "b.json"))
    assert (copy / "eval" / "weights" / "broadcasts" / "step_1" / "STABLE").exists()
    rewards = [[p["rewards"] for p in doc["models"]["step_1"]["problems"]] for doc in (from_broadcast, from_checkpoint)]
    assert rewards[0] == rewards[1]


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--step", "7"], "--step 7: no weights of step 7 in {run} (broadcasts: [0, 1, 2], checkpoints: [1, 2]); "
         "pass one of [0, 1, 2], or leave --step out for the newest (2)"),
        (["--k", "4", "--pass_at", "2,8"], "--pass_at 8: pass@k needs 1 <= k <= the samples drawn per problem "
         "(--k 4); raise --k to 8 or drop them from --pass_at"),
        (["--model.model", "{other}"], "--ckpt {run} was trained from model '{model}', but the recipe names "
         "'{other}': pass the run's own recipe (--config {run}/config.yaml) or --model.model {model}"),
        (["--num_examples", "9"], "--num_examples 9: the eval split has 6 problems; ask for at most that many"),
    ],
)  # fmt: skip
def test_bad_inputs_are_one_line_errors(run, tiny_model, tmp_path_factory, capsys, flags, message):
    other = str(tmp_path_factory.getbasetemp() / "other-model")
    if not Path(other).exists():
        build_tiny_model(other, seed=1)
    flags = [f.format(other=other) for f in flags]
    assert entry(["eval", *recipe(tiny_model), "--ckpt", str(run), *flags]) == 2
    err = capsys.readouterr().err
    assert f"grpokit: error: {message.format(run=run, model=tiny_model, other=other)}" in err


def test_eval_needs_weights_to_evaluate(tiny_model, capsys):
    assert entry(["eval", *recipe(tiny_model)]) == 2
    err = capsys.readouterr().err
    assert (
        "grpokit: error: grpokit eval: pass --ckpt RUN_DIR (a run's weights), --base (the recipe's model), or both"
        in err
    )
    assert "eval" in SUBCOMMANDS and "\n  eval " in USAGE


PARITY_ENV = '''
"""Reward 1.0 for a reply of even length; its parsed answer is the length's parity (for maj@n)."""
import verifiers.v1 as vf


class ParityTask(vf.Task[vf.TaskData]):
    @vf.reward(weight=1.0)
    async def even(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply or "") % 2 == 0)

    def parse_answer(self, reply: str) -> int:
        return len(reply) % 2


class ParityConfig(vf.TasksetConfig):
    num_tasks: int = 5


class ParityTaskset(vf.Taskset[ParityTask, ParityConfig]):
    def load(self):
        for i in range(self.config.num_tasks):
            yield ParityTask(vf.TaskData(prompt=f"Say {i} words.", id=f"parity-{i}"), self.config.task)


__all__ = ["ParityTaskset"]
'''


def test_majority_vote_where_the_task_parses_answers(tiny_model, tmp_path, monkeypatch):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "parity_env.py").write_text(PARITY_ENV)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    out = tmp_path / "base.json"
    env = '[{"id": "parity-env", "args": {"num_tasks": 5}}]'
    flags = ["--base", "--k", "4", "--temperature", "1.0", "--data.env", env, "--out", str(out)]
    try:
        doc = evaluate(tiny_model, *flags, "--output_dir", str(tmp_path))
    finally:
        sys.modules.pop("parity_env", None)
    metrics, problems = doc["models"]["base"]["metrics"]["parity-env"]["metrics"], doc["models"]["base"]["problems"]
    assert doc["notes"] == [] and len(problems) == 5
    expected = []
    for p in problems:  # the majority parity, ties to the first seen; parity 0 (even) is the right answer
        assert p["answers"] == [str(int(r == 0.0)) for r in p["rewards"]]
        zeros, ones = p["answers"].count("0"), p["answers"].count("1")
        expected.append(float(zeros > ones or (zeros == ones and p["answers"][0] == "0")))
    assert metrics["maj@4"]["mean"] == pytest.approx(sum(expected) / 5, abs=1e-12)


def test_eval_through_a_grpokit_infer_server(run, tiny_model, tmp_path):
    """A server engine samples with what its server loaded: `grpokit infer` following the run's broadcast is
    asked for step 1 (max_weight_step) although it published step 2, and the eval's requests stay pinned."""
    from tests.support.servers import serving

    broadcast = FilesystemBroadcast()
    broadcast.setup(run)
    flags = ["--ckpt", str(run), "--k", "2", "--num_examples", "3", "--temperature", "1.0", "--no_greedy"]
    with serving(tiny_model, broadcast) as (_, server):
        remote = ["--inference", "RemoteEngine", "--inference.init_args.base_url", server.url]
        remote += ["--inference.init_args.model_name", "tiny", "--inference.init_args.max_retries", "0"]
        doc = evaluate(tiny_model, *remote, *flags, "--step", "1", "--out", str(tmp_path / "remote.json"))
        assert doc["models"]["step_1"]["weight_step"] == 1 and server.app.engine.weight_step == 1
        assert all(len(p["rewards"]) == 2 for p in doc["models"]["step_1"]["problems"])
        base = ["--base", "--k", "2", "--num_examples", "3", "--out", str(tmp_path / "base.json")]
        with pytest.raises(ValueError, match=r"servers already hold newer weights than the base model: restart"):
            main(["eval", *recipe(tiny_model), *remote, *base])
    broadcast.close()


def test_a_multi_turn_game_is_evaluated_as_the_online_eval_plays_it(tiny_model, tmp_path):
    """guess-number answers every reply (respond), so each sample is a conversation of several turns:
    the command plays them through the same rollout path as the online evaluator, sample for sample."""
    env = '[{"id": "guess-number", "args": {"num_tasks": 3}}]'
    flags = ["--base", "--k", "2", "--temperature", "1.0", "--no_greedy", "--out", str(tmp_path / "g.json")]
    stop = ["e", "a", " "]  # the random model rarely ends a reply itself: a cut reply would end the game
    more = ["--data.env", env, "--data.max_turns", "3", "--data.sampling.stop", json.dumps(stop)]
    argv = tiny_fit_argv("-", tiny_model, "-", *more)[1:]
    drop = {i + d for i, a in enumerate(argv) if a in ("--output_dir", "--run_name") for d in (0, 1)}
    recipe_argv = [a for i, a in enumerate(argv) if i not in drop]
    assert main(["eval", *recipe_argv, "--output_dir", str(tmp_path), *flags]) == 0
    problems = json.loads((tmp_path / "g.json").read_text())["models"]["base"]["problems"]
    engine = BuiltinEngine()
    engine.setup(tiny_model)
    envs = [Environment(EnvSpec(id="guess-number", args={"num_tasks": 3}))]
    settings = EvalSettings(num_examples=-1, rollouts_per_example=2, temperature=1.0)
    evaluator = Evaluator(
        settings, envs, SamplingSettings(temperature=1.0, max_tokens=8), tmp_path, turns=TurnLimits(3, 128)
    )
    groups = evaluator.sample(engine, load_tokenizer(tiny_model))
    assert [[r.reward for r in g] for g in groups] == [p["rewards"] for p in problems]
    assert max(p["metrics"]["turns"] for p in problems) > 1  # several turns were played
