"""data.expert from an SFT dataset (Chord, as ms-swift's chord_sft_dataset): per_step records a step, drawn
by the seed and the step (the same in another run and after a resume), rendered with grpokit.sft's renderer
(assistant tokens only), packed as expert sequences outside the RL loss mask; bad input refused at the
start naming the key."""

import json

import pytest
import torch

from grpokit.common.models import load_tokenizer
from grpokit.environments.environment import EnvSpec
from grpokit.orchestrator import Orchestrator
from grpokit.orchestrator.experts import ExpertSettings
from grpokit.orchestrator.packing import pack
from grpokit.sft.render import ChatRenderer
from grpokit.sft.sources import SFTFields
from tests.support import make_rollout

pytestmark = pytest.mark.unit

RECORDS = [{"question": f"reverse word{i}", "reply": f"{i}drow"} for i in range(10)]
MAPPING = SFTFields(prompt="question", completion="reply")


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return load_tokenizer(tiny_model)


def prepared(tokenizer, seed=3, seq_len=256, **settings):
    env = [EnvSpec(id="reverse-text", args={"num_tasks": 4})]
    data = Orchestrator(env=env, seed=seed, seq_len=seq_len, expert=ExpertSettings(**settings))
    data.prepare(tokenizer)
    return data


def drawn(data, step):
    return [(r.prompt_ids, r.completion_ids, r.completion_mask) for r in data.inputs.experts.rollouts(step, [])]


def test_each_step_draws_the_same_records_in_every_loader_and_after_a_resume(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "sft.jsonl", RECORDS)
    a = prepared(tokenizer, path=path, fields=MAPPING, per_step=3)
    b = prepared(tokenizer, path=path, fields=MAPPING, per_step=3)
    first = {step: drawn(a, step) for step in range(4)}
    assert [drawn(b, step) for step in range(4)] == [first[s] for s in range(4)]
    resumed = prepared(tokenizer, path=path, fields=MAPPING, per_step=3)  # asked for step 2 first
    assert drawn(resumed, 2) == first[2]
    assert len({json.dumps(first[s]) for s in range(4)}) == 4  # each step its own records
    steps_0_to_2 = [r.example_id for s in range(3) for r in a.inputs.experts.rollouts(s, [])]
    assert sorted(steps_0_to_2[:9]) == sorted(set(steps_0_to_2[:9]))  # a pass draws each record once
    other_seed = prepared(tokenizer, seed=4, path=path, fields=MAPPING, per_step=3)
    assert drawn(other_seed, 0) != first[0]


def test_expert_rows_are_rendered_chats_with_the_assistant_mask_and_is_expert(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "sft.jsonl", RECORDS)
    data = prepared(tokenizer, path=path, fields=MAPPING, per_step=4)
    experts = data.inputs.experts.rollouts(5, [])
    renderer = ChatRenderer(tokenizer)
    for e in experts:
        record = RECORDS[e.example_id]
        chat = [{"role": "user", "content": record["question"]}, {"role": "assistant", "content": record["reply"]}]
        rendered = renderer.render(chat)
        assert e.is_expert and e.prompt_ids + e.completion_ids == rendered.input_ids
        assert [0] * len(e.prompt_ids) + e.completion_mask == rendered.loss_mask  # the sft renderer's mask
        assert e.prompt_ids == renderer.ids(chat[:1], generation_prompt=True)  # a rollout's prompt
        trained = [t for t, m in zip(e.completion_ids, e.completion_mask) if m]
        assert trained[-1] == tokenizer.eos_token_id
        assert tokenizer.decode(trained, skip_special_tokens=True) == record["reply"]
    [mb] = pack(experts, [[0.0] * len(e.completion_ids) for e in experts], [True] * 4, seq_len=1024)
    assert mb.num_loss_tokens == 0  # outside the RL loss mask
    assert mb.expert_mask_T.tolist() == [float(m) for e in experts for m in [0] * len(e.prompt_ids) + e.completion_mask]
    assert torch.equal(
        mb.input_ids_T[mb.expert_mask_T > 0],
        torch.tensor([t for e in experts for t, m in zip(e.completion_ids, e.completion_mask) if m]),
    )


def test_a_multi_turn_chat_trains_only_its_assistant_turns(tmp_path, tokenizer):
    chat = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "d"},
    ]
    data = prepared(tokenizer, path=write_jsonl(tmp_path / "chats.jsonl", [{"messages": chat}]), per_step=2)
    [e, again] = data.inputs.experts.rollouts(0, [])
    assert (e.prompt_ids, e.completion_ids) == (again.prompt_ids, again.completion_ids)  # one record, twice
    trained = [t for t, m in zip(e.completion_ids, e.completion_mask) if m]
    untrained = [t for t, m in zip(e.completion_ids, e.completion_mask) if not m]
    assert tokenizer.decode(trained, skip_special_tokens=True) == "bd"
    assert "c" in tokenizer.decode(untrained) and "user" in tokenizer.decode(untrained)


def test_records_over_seq_len_are_dropped_and_counted(tmp_path, tokenizer):
    long = {"question": "x " * 200, "reply": "y"}
    path = write_jsonl(tmp_path / "sft.jsonl", [*RECORDS[:3], long])
    data = prepared(tokenizer, seq_len=64, path=path, fields=MAPPING, per_step=4)
    assert (len(data.inputs.experts.records), data.inputs.experts.dropped) == (3, 1)
    assert all(r.num_tokens <= 64 for s in range(3) for r in data.inputs.experts.rollouts(s, []))
    with pytest.raises(ValueError, match=r"every record is over data.seq_len \(64\) tokens"):
        prepared(tokenizer, seq_len=64, path=write_jsonl(tmp_path / "long.jsonl", [long]), fields=MAPPING)


def test_reference_answers_stay_the_default_source(tokenizer):
    settings = ExpertSettings()
    assert (settings.field, settings.template, settings.path) == ("answer", "{answer}", None)
    data = prepared(tokenizer)
    group = [make_rollout([5, 6], prompt_ids=[1, 2], group_id=9, example_id=2, env_id="reverse-text")]
    [expert] = data.inputs.experts.rollouts(0, [group])
    answer = data.inputs.training[0].examples[2].task.data.answer
    assert expert.is_expert and (expert.completion_text, expert.group_id) == (answer, 9)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"path": "sft.jsonl", "field": "answer"}, r"data.expert has two sources.*set one: data.expert.field and "),
        ({"path": "sft.jsonl", "template": "{answer}"}, r"data.expert has two sources"),
        ({"path": "sft.jsonl", "per_step": 0}, r"data.expert.per_step must be >= 1 .*got 0"),
        (
            {"fields": SFTFields(prompt="q")},
            r"data.expert.fields maps the records of data.expert.path, which is not set",
        ),
    ],
)
def test_bad_settings_name_the_key(settings, message):
    with pytest.raises(ValueError, match=message):
        ExpertSettings(**settings)


def test_bad_data_is_refused_at_the_start_naming_the_key(tmp_path, tokenizer):
    with pytest.raises(ValueError, match=r"data.expert.path '.*missing.jsonl': no such file or folder; set data."):
        prepared(tokenizer, path=str(tmp_path / "missing.jsonl"))
    path = write_jsonl(tmp_path / "sft.jsonl", RECORDS)
    with pytest.raises(
        ValueError,
        match=r"example 0 has neither data.expert.fields.messages .*\['question', 'reply'\].*data.expert.fields",
    ):
        prepared(tokenizer, path=path)  # the records need the mapping
    no_reply = [{"messages": [{"role": "user", "content": "hi"}]}]
    with pytest.raises(
        ValueError, match=r"data.expert.path .* example 0: no assistant turn .*check data.expert.fields"
    ):
        prepared(tokenizer, path=write_jsonl(tmp_path / "no_reply.jsonl", no_reply))
