"""Which examples a step trains is a function of the step: each pass covers every example once, two
instances agree, and a step's micro-batches carry exactly its examples' assistant tokens."""

import json

import pytest

from grpokit.sft.datamodule import SFTData

pytestmark = pytest.mark.unit


def data(tmp_path, tiny_model, **settings):
    chats = [
        [{"role": "user", "content": f"say {i}"}, {"role": "assistant", "content": f"{i} " * (i + 1)}]
        for i in range(10)
    ]  # noqa: E501
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in chats))
    sft = SFTData(path=str(path), batch_size=4, seq_len=64, **settings)
    sft.prepare(sft.tokenizer_for(tiny_model))
    return sft


def test_one_pass_covers_every_example_once_and_steps_are_reproducible(tmp_path, tiny_model):
    a, b = data(tmp_path, tiny_model, seed=3), data(tmp_path, tiny_model, seed=3)
    assert a.connect(-1) == 3  # trainer.max_steps -1: ceil(10 / 4) steps
    first_pass = [i for step in range(3) for i in a.example_indices(step)][:10]
    assert sorted(first_pass) == list(range(10))
    assert [a.example_indices(s) for s in range(6)] == [b.example_indices(s) for s in range(6)]
    assert data(tmp_path, tiny_model, seed=4).example_indices(0) != a.example_indices(0)


def test_a_steps_micro_batches_hold_its_examples_assistant_tokens(tmp_path, tiny_model):
    sft = data(tmp_path, tiny_model)
    sft.connect(5)
    batch = sft.batch(2)
    examples = [sft.train_examples[i] for i in sft.example_indices(2)]
    assert batch.step == 2 and all(mb.num_tokens <= 64 for mb in batch.micro_batches)
    assert batch.num_loss_tokens == sum(sum(e.loss_mask) for e in examples)
    assert sorted(len(e.input_ids) for e in examples) == sorted(
        n for mb in batch.micro_batches for n in mb.seq_lens_N.tolist()
    )
    assert [b.step for b in sft.train_dataloader()] == [0, 1, 2, 3, 4]


def test_the_held_out_share_is_kept_out_of_training(tmp_path, tiny_model):
    sft = data(tmp_path, tiny_model, eval_fraction=0.2)
    assert len(sft.eval_examples) == 2 and len(sft.train_examples) == 8
    train = {tuple(e.input_ids) for e in sft.train_examples}
    assert not train & {tuple(e.input_ids) for e in sft.eval_examples}
    assert sum(mb.num_loss_tokens for mb in sft.eval_batch()) == sum(sum(e.loss_mask) for e in sft.eval_examples)
