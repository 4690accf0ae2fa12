"""The same examples read from JSONL, Parquet, CSV and a datasets.save_to_disk folder, with a field
mapping, give the same chats; an environment's examples are answered with their reference answers."""

import csv
import json

import pytest

from grpokit.environments import EnvSpec
from grpokit.sft.sources import SFTFields, environment_chats, read_records, record_chats

pytestmark = pytest.mark.unit

CHAT = [
    {"role": "user", "content": "2 + 2?"},
    {"role": "assistant", "content": "4"},
]
RECORDS = [
    {"conversation": CHAT, "id": 0},
    {"conversation": CHAT[:1] + [{"role": "assistant", "content": "four"}], "id": 1},
]
FIELDS = SFTFields(messages="conversation")


def write_all(tmp_path):
    """RECORDS as a .jsonl, .parquet and .csv file and a save_to_disk folder (a DatasetDict)."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    pq.write_table(pa.Table.from_pylist(RECORDS), tmp_path / "d.parquet")
    with open(tmp_path / "d.csv", "w", newline="") as f:  # a CSV cell holds the messages as JSON text
        writer = csv.DictWriter(f, ["conversation", "id"])
        writer.writeheader()
        writer.writerows({**r, "conversation": json.dumps(r["conversation"])} for r in RECORDS)
    datasets.DatasetDict({"train": datasets.Dataset.from_list(RECORDS)}).save_to_disk(tmp_path / "folder")
    return [tmp_path / "d.jsonl", tmp_path / "d.parquet", tmp_path / "d.csv", tmp_path / "folder"]


def test_every_format_gives_the_same_chats(tmp_path):
    for path in write_all(tmp_path):
        chats = record_chats(read_records(str(path)), FIELDS, str(path))
        assert [messages for messages, _ in chats] == [r["conversation"] for r in RECORDS], path.name


def test_a_missing_split_and_a_missing_file_name_the_key(tmp_path):
    write_all(tmp_path)
    with pytest.raises(ValueError, match=r"data.split 'test': .* has the splits \['train'\]"):
        read_records(str(tmp_path / "folder"), "test")
    with pytest.raises(FileNotFoundError, match="data.path .*no such file"):
        read_records(str(tmp_path / "nope.jsonl"))


def test_environment_examples_are_answered_with_their_reference_answer():
    chats = environment_chats([EnvSpec(id="reverse-text", args={"num_tasks": 3})], "answer", "{answer}")
    assert len(chats) == 3
    for messages, tools in chats:
        assert tools is None and messages[-1]["role"] == "assistant" and messages[-2]["role"] == "user"
    with pytest.raises(ValueError, match="data.answer_field is 'solution'"):
        environment_chats([EnvSpec(id="reverse-text", args={"num_tasks": 1})], "solution", "{answer}")
