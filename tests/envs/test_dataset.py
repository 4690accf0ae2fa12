"""dataset: Parquet files and save_to_disk folders as an environment, field mapping, errors that name the
file, field and columns, few-shot prompts, and the gsm8k / exact / format rewards via Environment.score."""

import builtins

import pytest

from grpokit.environments.environment import Environment, EnvSpec
from grpokit.envs.gsm8k import HERE

datasets = pytest.importorskip("datasets")

ROWS = {
    "q": ["Tom has 2 apples and buys 3. How many?", "Ana has 10 pens and gives 4 away. How many?", "What is 6 * 7?"],
    "a": ["2 + 3 = 5\n#### 5", "10 - 4 = 6\n#### 6", "#### 42"],
    "sys": ["Be brief.", "Show work.", "Box it."],
}


GSM8K_TRAIN = HERE / "train.jsonl"


def load(path, **args) -> Environment:
    return Environment(EnvSpec(id="dataset", args={"path": str(path), **args}))


def load_gsm8k() -> Environment:
    return Environment(EnvSpec(id="gsm8k", args={"num_tasks": 3}))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A Parquet file, a save_to_disk Dataset folder and a DatasetDict folder (train + test) of ROWS."""
    root = tmp_path_factory.mktemp("data")
    table = datasets.Dataset.from_dict(ROWS)
    table.to_parquet(str(root / "rows.parquet"))
    table.save_to_disk(str(root / "one"))
    datasets.DatasetDict({"train": table, "test": table.select([2])}).save_to_disk(str(root / "splits"))
    return root


def test_parquet_file_with_field_mapping(files):
    env = load(files / "rows.parquet", prompt_field="q", answer_field="a")
    assert [ex.messages for ex in env.examples][0] == [{"role": "user", "content": ROWS["q"][0]}]
    assert [ex.task.data.answer for ex in env.examples] == ROWS["a"]
    assert [ex.task.data.id for ex in env.examples] == ["rows.parquet:0", "rows.parquet:1", "rows.parquet:2"]
    assert len(load(files / "rows.parquet", prompt_field="q", answer_field="a", num_tasks=2).examples) == 2


def test_jsonl_and_csv_files(tmp_path):
    env = load(GSM8K_TRAIN, num_tasks=3)  # the gsm8k sample's JSONL, read through datasets
    assert [ex.task.data.answer for ex in env.examples] == [ex.task.data.answer for ex in load_gsm8k().examples[:3]]
    datasets.Dataset.from_dict(ROWS).to_csv(str(tmp_path / "rows.csv"), index=False)
    assert len(load(tmp_path / "rows.csv", prompt_field="q", answer_field="a").examples) == 3


def test_save_to_disk_folders_and_splits(files):
    assert len(load(files / "one", prompt_field="q", answer_field="a").examples) == 3
    assert len(load(files / "splits", prompt_field="q", answer_field="a").examples) == 3  # "train" by default
    test = load(files / "splits", split="test", prompt_field="q", answer_field="a")
    assert [ex.task.data.answer for ex in test.examples] == ["#### 42"]
    assert test.examples[0].task.data.id == "splits:test:0"


def test_system_prompts(files):
    per_row = load(files / "rows.parquet", prompt_field="q", answer_field="a", system_field="sys")
    assert [ex.messages[0] for ex in per_row.examples] == [{"role": "system", "content": s} for s in ROWS["sys"]]
    fixed = load(files / "rows.parquet", prompt_field="q", answer_field="a", system_prompt_text="Answer in \\boxed{}.")
    assert {ex.messages[0]["content"] for ex in fixed.examples} == {"Answer in \\boxed{}."}


def test_few_shot_rows_are_shown_and_left_out(files):
    env = load(files / "rows.parquet", prompt_field="q", answer_field="a", few_shot=2, num_tasks=1)
    (ex,) = env.examples
    assert ex.task.data.answer == "#### 42"
    assert ex.messages == [
        {
            "role": "user",
            "content": f"Question: {ROWS['q'][0]}\nAnswer: {ROWS['a'][0]}\n\n"
            f"Question: {ROWS['q'][1]}\nAnswer: {ROWS['a'][1]}\n\n"
            f"Question: {ROWS['q'][2]}\nAnswer:",
        }
    ]


def test_rewards(files):
    env = load(files / "rows.parquet", prompt_field="q", answer_field="a")
    ex = env.examples[0]  # answer "#### 5"
    replies = ["\\boxed{5}", "2 + 3 = 5", "#### 5.0", "\\boxed{6}", "five", ""]
    scored = env.score([ex] * len(replies), replies)
    assert [r for r, _ in scored] == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    assert [m["formatted"] for _, m in scored] == [1.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    mixed = load(files / "rows.parquet", prompt_field="q", answer_field="a", task={"format_weight": 0.25})
    rewards = [r for r, _ in mixed.score([mixed.examples[0]] * 4, ["\\boxed{5}", "so 5", "\\boxed{6}", "6"])]
    assert rewards == [1.0, 0.75, 0.25, 0.0]
    exact = load(files / "rows.parquet", prompt_field="q", answer_field="a", task={"match": "exact"})
    assert [r for r, _ in exact.score([exact.examples[2]] * 2, ["#### 42", "42"])] == [1.0, 0.0]


def test_numeric_answers_are_text(tmp_path):
    datasets.Dataset.from_dict({"question": ["1 + 1?"], "answer": [2]}).to_parquet(str(tmp_path / "n.parquet"))
    env = load(tmp_path / "n.parquet")
    assert env.examples[0].task.data.answer == "2"
    assert env.score(env.examples, ["\\boxed{2}"])[0][0] == 1.0


def test_missing_path_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.parquet"):
        load(tmp_path / "nope.parquet")


def test_missing_column_names_the_file_field_and_columns(files):
    with pytest.raises(ValueError, match=r"rows\.parquet has no column 'question' \(prompt_field\); its columns are"):
        load(files / "rows.parquet")
    with pytest.raises(ValueError, match=r"no column 'solution' \(answer_field\); its columns are \['q', 'a', 'sys'\]"):
        load(files / "rows.parquet", prompt_field="q", answer_field="solution")
    with pytest.raises(ValueError, match=r"splits split 'test' has no column 'prompt' \(prompt_field\)"):
        load(files / "splits", split="test", prompt_field="prompt", answer_field="a")


def test_bad_splits(files):
    with pytest.raises(
        ValueError, match=r"has no split 'validation' \(args.split\); its splits are \['test', 'train'\]"
    ):
        load(files / "splits", split="validation", prompt_field="q", answer_field="a")
    with pytest.raises(ValueError, match=r"rows\.parquet is one table without splits; leave args.split unset"):
        load(files / "rows.parquet", split="train", prompt_field="q", answer_field="a")


def test_unreadable_inputs(tmp_path):
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(ValueError, match=r"cannot read .*bad\.parquet as \.parquet"):
        load(tmp_path / "bad.parquet")
    (tmp_path / "rows.txt").write_text("x")
    with pytest.raises(ValueError, match=r"rows\.txt: unknown file type; expected one of \.parquet"):
        load(tmp_path / "rows.txt")
    (tmp_path / "folder").mkdir()
    with pytest.raises(ValueError, match=r"folder is not a folder written by datasets' save_to_disk"):
        load(tmp_path / "folder")


def test_an_answer_without_a_number_is_refused_for_gsm8k(tmp_path):
    datasets.Dataset.from_dict({"question": ["Name a color."], "answer": ["blue"]}).to_parquet(
        str(tmp_path / "c.parquet")
    )
    with pytest.raises(ValueError, match=r"c\.parquet row 0 \(answer_field 'answer'\): answer 'blue' has no number"):
        load(tmp_path / "c.parquet")
    assert len(load(tmp_path / "c.parquet", task={"match": "exact"}).examples) == 1


def test_a_cell_that_is_not_text_names_the_row(tmp_path):
    datasets.Dataset.from_dict({"question": ["a", "b"], "answer": [["1"], ["2"]]}).to_parquet(
        str(tmp_path / "l.parquet")
    )
    with pytest.raises(ValueError, match=r"l\.parquet row 0: column 'answer' holds list"):
        load(tmp_path / "l.parquet")


def test_without_datasets_the_error_names_the_pip_command(files, monkeypatch):
    real_import = builtins.__import__

    def no_datasets(name, *args, **kwargs):
        if name == "datasets":
            raise ModuleNotFoundError("No module named 'datasets'", name="datasets")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_datasets)
    with pytest.raises(ImportError, match=r"pip install datasets"):
        load(files / "rows.parquet", prompt_field="q", answer_field="a")
