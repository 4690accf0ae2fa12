"""Bad SFT input stops the start with a ValueError naming the key and the fix, before any step: a dataset
without the mapped fields, an empty assistant turn, a chat template that cannot mark assistant spans, a
tokenizer other than the policy's."""

import json
import shutil

import pytest

from grpokit.common.models import load_tokenizer
from grpokit.main import entry
from grpokit.sft.datamodule import SFTData
from grpokit.sft.sources import SFTFields
from tests.sft.test_sft_cli import sft_argv

pytestmark = pytest.mark.unit

# Qwen3-style: earlier assistant turns lose their content once a later turn follows
FORGETFUL = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' and not loop.last %}{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TWO_TURNS = [
    {"role": "user", "content": "a"},
    {"role": "assistant", "content": "b"},
    {"role": "user", "content": "c"},
    {"role": "assistant", "content": "d"},
]


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def prepared(tiny_model, **settings):
    data = SFTData(**settings)
    data.prepare(data.tokenizer_for(tiny_model))
    return data


def test_missing_mapped_fields_name_the_keys_and_the_fields_the_data_has(tmp_path, tiny_model):
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "q", "answer": "a"}])
    with pytest.raises(ValueError, match=r"example 0 has neither data.fields.messages .*\['answer', 'question'\]"):
        prepared(tiny_model, path=path)
    data = prepared(tiny_model, path=path, fields=SFTFields(prompt="question", completion="answer"))  # the fix
    assert len(data.train_examples) == 1


def test_an_empty_assistant_turn_is_refused(tmp_path, tiny_model):
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "  "}]
    path = write_jsonl(tmp_path / "d.jsonl", [{"messages": TWO_TURNS}, {"messages": chat}])
    with pytest.raises(ValueError, match=r"example 1: assistant turn 1 is empty .*remove the turn or the example"):
        prepared(tiny_model, path=path)


def test_a_chat_without_an_assistant_turn_is_refused(tmp_path, tiny_model):
    path = write_jsonl(tmp_path / "d.jsonl", [{"messages": TWO_TURNS[:1]}])
    with pytest.raises(ValueError, match="no assistant turn to train on"):
        prepared(tiny_model, path=path)


def forgetful_model(tmp_path, tiny_model):
    """The tiny model with a template that rewrites earlier assistant turns."""
    folder = tmp_path / "forgetful"
    shutil.copytree(tiny_model, folder)
    tokenizer = load_tokenizer(tiny_model)
    tokenizer.chat_template = FORGETFUL
    tokenizer.save_pretrained(folder)
    return str(folder)


def test_a_template_that_cannot_mark_assistant_spans_is_refused(tmp_path, tiny_model):
    path = write_jsonl(tmp_path / "d.jsonl", [{"messages": TWO_TURNS}])
    model = forgetful_model(tmp_path, tiny_model)
    with pytest.raises(ValueError, match=r"renders assistant turn 1 differently once later turns follow"):
        prepared(model, path=path)
    assert (
        len(prepared(model, path=write_jsonl(tmp_path / "one.jsonl", [{"messages": TWO_TURNS[:2]}])).train_examples)
        == 1
    )  # noqa: E501


def test_a_tokenizer_other_than_the_policys_is_refused(tmp_path, tiny_model):
    path = write_jsonl(tmp_path / "d.jsonl", [{"messages": TWO_TURNS}])
    other = forgetful_model(tmp_path, tiny_model)
    with pytest.raises(ValueError, match=r"data.tokenizer .* differs from the policy's .*set data.tokenizer: null"):
        prepared(tiny_model, path=path, tokenizer=other)
    assert prepared(tiny_model, path=path, tokenizer=tiny_model).train_examples  # the same tokenizer is fine


def test_overlong_examples_are_dropped_or_cut_and_counted(tmp_path, tiny_model, caplog):
    long_chat = [{"role": "user", "content": "x " * 200}, {"role": "assistant", "content": "y " * 200}]
    path = write_jsonl(tmp_path / "d.jsonl", [{"messages": TWO_TURNS}, {"messages": long_chat}])
    with caplog.at_level("WARNING", logger="grpokit.sft.datamodule"):
        dropped = prepared(tiny_model, path=path, seq_len=256)
        cut = prepared(tiny_model, path=path, seq_len=256, overlong="truncate")
    assert len(dropped.train_examples) == 1 and dropped.overlong_counts["training"] == (0, 1)
    assert [len(e.input_ids) <= 256 for e in cut.train_examples] == [True, True]
    assert cut.overlong_counts["training"] == (1, 0) and cut.train_examples[1].truncated
    assert "1 cut, 0 dropped" in caplog.text and "0 cut, 1 dropped" in caplog.text


def test_the_command_stops_before_any_step_with_one_line(tmp_path, tiny_model, capsys):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "q"}])  # no completion
    argv = [*sft_argv(tmp_path, tiny_model, "bad"), "--data.env", "null", "--data.path", path]
    assert entry([*argv, "--data.eval_fraction", "0"]) == 2
    err = capsys.readouterr().err
    assert "grpokit: error: data.path" in err and "data.fields.completion" in err
    assert not (tmp_path / "bad").exists()  # nothing trained, nothing written
