"""`grpokit bench` on CPU with the tiny shape: each bench runs both paths and they agree numerically."""

from __future__ import annotations

import json

import torch

from grpokit.bench.command import main


def test_generate_bench_paths_agree_and_report(tmp_path):
    out = tmp_path / "g.json"
    assert (
        main(
            [
                "generate",
                "--model",
                "tiny",
                "--device",
                "cpu",
                "--batch",
                "4",
                "--prompt-len",
                "8",
                "--new-tokens",
                "8",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    r = json.loads(out.read_text())
    assert r["grpokit"]["tokens_per_s"] > 0 and r["hf_generate"]["tokens_per_s"] > 0
    assert r["logprobs_vs_forward"]["max_abs_logprob_diff"] < 1e-4  # float32: the engine's logprobs are the model's
    assert r["speedup_vs_hf"] == r["grpokit"]["tokens_per_s"] / r["hf_generate"]["tokens_per_s"]
    assert 0 < r["fraction_of_roofline"] and r["roofline"]["bytes_per_step_gb"] > 0


def test_train_bench_paths_compute_the_same_logprobs(tmp_path):
    out = tmp_path / "t.json"
    argv = [
        "train",
        "--model",
        "tiny",
        "--device",
        "cpu",
        "--tokens",
        "192",
        "--seq-len",
        "64",
        "--steps",
        "1",
        "--chunk-size",
        "50",
        "--json",
        str(out),
    ]
    assert main(argv) == 0
    r = json.loads(out.read_text())
    assert r["max_abs_logprob_diff_first_step"] < 1e-4  # varlen + chunked == dense mask + full logits
    assert r["grpokit"]["ms_per_step"] > 0 and r["naive"]["ms_per_step"] > 0


def test_train_bench_on_a_grpo_shaped_batch_shares_prompts_and_agrees_on_the_trained_tokens(tmp_path):
    from grpokit.bench.trainer import packed_batch
    from grpokit.common.prefix_tree import prefix_tree

    ids, pos, lens, _, mask = packed_batch(192, 24, 1000, "cpu", group_size=4, prompt_len=16)
    assert prefix_tree(ids, pos, lens).num_nodes == 2 * 16 + 8 * 8  # 2 groups of 4 sequences of 16 + 8 tokens
    assert torch.equal(mask, (pos >= 16).float())
    out = tmp_path / "t.json"
    argv = [
        "train",
        "--model",
        "tiny",
        "--device",
        "cpu",
        "--tokens",
        "192",
        "--seq-len",
        "24",
        "--steps",
        "1",
        "--group-size",
        "4",
        "--prompt-len",
        "16",
        "--variants",
        "grpokit_dense,grpokit,naive",
        "--json",
        str(out),
    ]
    assert main(argv) == 0
    r = json.loads(out.read_text())
    assert (r["group_size"], r["prompt_len"]) == (4, 16)
    assert r["grpokit_dense"]["max_abs_logprob_diff_first_step"] < 1e-4  # the tree == the packed row
    assert r["max_abs_logprob_diff_first_step"] < 1e-4


def test_step_bench_reports_the_overlap():
    from grpokit.bench.step import run

    r = run("tiny", batch=4, prompt_len=8, new_tokens=8, micro_tokens=32, steps=1, dtype=torch.float32, device="cpu")
    assert r["train_tokens"] == 64 and r["overlapped_step_s"] > 0
    assert r["ratio_to_max"] == r["overlapped_step_s"] / max(r["generation_s"], r["training_s"])


class Stream:
    """An iterable of TrainingBatches, as the orchestrator's BatchStream (a list would read as several dataloaders)."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)


def test_train_bench_step_is_the_policys_training_step(tmp_path):
    """The bench's grpokit step changes the adapter exactly as Policy.training_step under Lightning does."""
    import lightning as L

    from grpokit.bench.shapes import model_folder
    from grpokit.bench.trainer import bench_policy, micro_batch, sample_with_policy
    from grpokit.types import TrainingBatch

    def policy_and_batch(folder):
        policy = bench_policy(folder, torch.float32, "cpu", 4, 50, checkpointing=True, compile=False)
        policy.max_grad_norm = 1e-3  # clipping binds
        batch = TrainingBatch(step=0, micro_batches=[micro_batch(96, 40, policy.lm.config.vocab_size, "cpu")] * 2)
        sample_with_policy(policy, batch)
        return policy, batch

    def adapter(policy):
        return {k: v.detach().clone() for k, v in policy.lm.named_parameters() if v.requires_grad}

    with model_folder("tiny", torch.float32, "cpu") as folder:
        bench, batch = policy_and_batch(folder)
        fit, fit_batch = policy_and_batch(folder)
    before = adapter(bench)
    bench.train_batch(batch, bench.make_optimizer())
    trainer = L.Trainer(
        max_steps=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    trainer.fit(fit, train_dataloaders=Stream([fit_batch]))
    after_bench, after_fit = adapter(bench), adapter(fit)
    assert any(not torch.equal(after_bench[k], before[k]) for k in before)  # the step trained the adapter
    assert all(torch.equal(after_bench[k], after_fit[k]) for k in before)  # the same operations, bit for bit


def test_multiturn_bench_runs_both_variants_and_they_agree(tmp_path, tiny_model):
    out = tmp_path / "m.json"
    sizes = ["--conversations", "3", "--turns", "3", "--prompt-len", "6", "--new-tokens", "4", "--env-tokens", "5"]
    assert main(["multiturn", "--model", tiny_model, *sizes, "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    first, *later = r["per_turn"]
    assert first["on"]["reused_tokens"] == 0 and first["on"]["prefill_tokens"] == first["off"]["prefill_tokens"] == 18
    for turn in later:
        assert turn["same_tokens"] == "3/3" and turn["max_abs_logprob_diff"] < 1e-5
        assert turn["on"]["prefill_tokens"] == 3 * (1 + 5)  # each reply's last token and the environment's
        on, off = turn["on"], turn["off"]
        assert on["prefill_tokens"] + on["reused_tokens"] == off["prefill_tokens"] == off["prompt_tokens"]
    assert r["total"]["on"]["prefill_tokens"] < r["total"]["off"]["prefill_tokens"]


def test_stream_bench_runs_both_variants_on_the_same_lengths(tmp_path, tiny_model):
    out = tmp_path / "s.json"
    sizes = ["--steps", "3", "--groups", "3", "--group-size", "2", "--prompt-len", "5", "--max-tokens", "24"]
    assert main(["stream", "--model", tiny_model, *sizes, "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    whole, streamed = r["whole_batch"], r["streaming"]
    assert r["lengths"]["min"] == 8 and r["lengths"]["max"] <= 24
    # whole-batch decodes each step until its longest group ends, so its rows idle in the tail
    assert whole["decode_steps"] > 0 and 0 < whole["occupancy"] <= 1 and whole["tokens_per_second"] > 0
    assert streamed["occupancy"] == 1.0 > whole["occupancy"]  # a finished group's rows refilled at once


def test_stream_bench_with_train_overlaps_each_variant_with_policy_steps(tmp_path, tiny_model):
    out = tmp_path / "s.json"
    sizes = ["--steps", "4", "--groups", "3", "--group-size", "2", "--prompt-len", "5", "--max-tokens", "24"]
    assert main(["stream", "--model", tiny_model, *sizes, "--train", "--micro-tokens", "64", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    training = r["training"]
    assert training["seconds"] > 0 and training["async_level"] == 1
    mean_len = training["tokens_per_step"] / 6 - 5  # 3 groups x 2 rows of prompt + completion
    assert r["lengths"]["min"] <= mean_len <= r["lengths"]["max"]
    for name in ("whole_batch", "streaming"):
        v = r[name]
        assert v["overlapped_total_s"] >= 3 * v["overlapped_step_s"] > 0
        assert v["ratio_to_max"] == v["overlapped_step_s"] / max(v["seconds_per_step"], training["seconds"])
        assert v["ratio_to_sum"] == v["overlapped_step_s"] / (v["seconds_per_step"] + training["seconds"])
    assert r["step_speedup"] == r["whole_batch"]["overlapped_step_s"] / r["streaming"]["overlapped_step_s"]
