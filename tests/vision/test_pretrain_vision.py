"""`grpokit pretrain-vision` (grpokit.pretrain): label targets, loss and accuracy on hand-made cases
(float64), the pooling heads' padding, and the command on each tiny family: only the vision parts move,
the written folder loads and renders, its held-out colour accuracy rises, and bad input names the fix."""

from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import AutoModelForImageTextToText

from grpokit.main import main
from grpokit.pretrain.labels import LabelHeads, label_accuracy, label_loss, label_targets, label_values
from grpokit.trainer.vision_parts import part_of
from grpokit.vision.render import load_processor


def test_label_targets_loss_and_accuracy_by_hand():
    labels = [{"colour": "red", "side": "left"}, {"colour": "blue"}, {"colour": "red", "side": "right"}]
    values = label_values(labels)
    assert values == {"colour": ["blue", "red"], "side": ["left", "right"]}
    target = label_targets([*labels, {"colour": "green"}], values)  # green: never seen in training
    assert target.tolist() == [[1, 0], [0, -1], [1, 1], [-1, -1]]

    colour = torch.tensor([[0.0, 1.0], [2.0, 0.0], [0.0, 0.0], [5.0, 0.0]], dtype=torch.float64)
    side = torch.tensor([[1.0, 0.0], [9.0, 9.0], [1.0, 0.0], [0.0, 0.0]], dtype=torch.float64)
    # colour over rows 0-2: -log softmax picks; side over rows 0 and 2 (row 1 has no side)
    by_hand_colour = (math.log(1 + math.e**-1) + math.log(1 + math.e**-2) + math.log(2)) / 3
    by_hand_side = (math.log(1 + math.e**-1) + math.log(1 + math.e)) / 2
    got = label_loss([colour, side], target)
    assert got.item() == pytest.approx((by_hand_colour + by_hand_side) / 2, abs=1e-12)
    # a batch without any side label: the colour loss alone
    alone = label_loss([colour[1:2], side[1:2]], target[1:2]).item()
    assert alone == pytest.approx(math.log(1 + math.e**-2), abs=1e-12)

    accuracy = label_accuracy([colour, side], target, ["colour", "side"])
    # colour: rows 0 (red) and 1 (blue) right, row 2 a tie (argmax blue) wrong; side: row 0 right, row 2 wrong
    assert accuracy == {"colour": pytest.approx(2 / 3), "side": 0.5, "mean": pytest.approx((2 / 3 + 0.5) / 2)}
    with pytest.raises(ValueError, match="--labels_field"):
        label_values([{}, {}])


def test_the_heads_ignore_padding():
    torch.manual_seed(0)
    heads = LabelHeads(hidden=64, values={"colour": ["blue", "red"], "kind": ["a", "b", "c"]}).eval()
    short, long = torch.randn(3, 64), torch.randn(7, 64)
    with torch.no_grad():
        together = heads([short, long])
        alone = [torch.cat(pair) for pair in zip(heads([short]), heads([long]))]
    for got, want in zip(together, alone):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


def pretrain(model: str, out, *flags: str, env_args: dict | None = None) -> int:
    args = env_args or {"num_tasks": 400, "size": 56, "question": "colour"}
    return main(["pretrain-vision", "--model", model, "--env", "shapes", "--env_args", json.dumps(args)]
                + ["--out", str(out), "--num_threads", "1", *flags])  # fmt: skip


def test_pretraining_moves_only_the_vision_parts_and_learns_colours(vl_family, tmp_path):
    family, path, _, before = vl_family
    out = tmp_path / "tower"
    flags = ["--steps", "100", "--batch_size", "16", "--lr", "3e-3", "--eval_pictures", "32", "--eval_interval", "5"]
    assert pretrain(path, out, *flags) == 0

    record = json.loads((out / "pretrain.json").read_text())
    assert record["labels"] == {
        "colour": ["blue", "green", "orange", "purple", "red", "yellow"],
        "count": ["one"],
        "kind": ["circle", "square", "triangle"],
    }
    first, last = record["history"][0], record["history"][-1]
    assert [first["step"], last["step"]] == [5, 100]
    # colour, the plainest thing a picture shows, is learned: from near a guess (1/6) at step 5
    colour = [row["eval/accuracy/colour"] for row in record["history"]]
    assert colour[0] < 0.5 and colour[-1] >= 0.9, colour

    after = AutoModelForImageTextToText.from_pretrained(str(out), dtype=torch.float32)
    moved = {part_of(n) for n, p in after.named_parameters() if not torch.equal(p, before.get_parameter(n))}
    assert moved == {"tower"}, (family, moved)  # the projector learns in SFT
    assert load_processor(str(out)).image_processor.to_dict() == load_processor(path).image_processor.to_dict()


def test_bad_input_names_the_fix(vl_family, tmp_path):
    _, path, _, _ = vl_family
    with pytest.raises(ValueError, match="no field 'tags' of labels.*--labels_field"):
        pretrain(path, tmp_path / "a", "--labels_field", "tags", "--steps", "1")
    with pytest.raises(ValueError, match="give the environment more examples"):
        pretrain(path, tmp_path / "b", "--steps", "1", env_args={"num_tasks": 20, "question": "colour"})
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "keep.txt").write_text("x")
    with pytest.raises(SystemExit, match="--force"):
        pretrain(path, tmp_path / "c", "--steps", "1")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
