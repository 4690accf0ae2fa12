"""Atomic writes of a path-taking writer and of folders: a reader sees the old or the whole new one; a
create that never replaces (eval reports)."""

import json

import pytest

from grpokit.common.io import atomic_folder, atomic_path


def test_atomic_path_renames_what_was_written_and_drops_it_on_error(tmp_path):
    final = tmp_path / "a" / "step_1.ckpt"
    with atomic_path(final) as tmp:
        tmp.write_text("new")
        assert not final.exists()
    assert final.read_text() == "new"
    with pytest.raises(RuntimeError), atomic_path(final) as tmp:
        tmp.write_text("half")
        raise RuntimeError("disk full")
    assert final.read_text() == "new" and list(final.parent.iterdir()) == [final]
    with atomic_path(final):
        pass  # a DDP rank > 0 writes nothing: the file stays
    assert final.read_text() == "new"


def test_atomic_folder_replaces_or_keeps_and_leaves_nothing_half_written(tmp_path):
    final = tmp_path / "step_3"
    with atomic_folder(final) as tmp:
        (tmp / "w").write_text("1")
    assert (final / "w").read_text() == "1"
    with pytest.raises(OSError), atomic_folder(final, tmp_path / ".step_3.tmp") as tmp:
        (tmp / "w").write_text("2")
        raise OSError("disk full")
    assert (final / "w").read_text() == "1" and sorted(p.name for p in tmp_path.iterdir()) == ["step_3"]
    with atomic_folder(final, keep_existing=True) as tmp:
        (tmp / "w").write_text("3")  # another process got there first: its folder stays
    assert (final / "w").read_text() == "1" and sorted(p.name for p in tmp_path.iterdir()) == ["step_3"]
    with atomic_folder(final) as tmp:
        (tmp / "w").write_text("4")
    assert (final / "w").read_text() == "4"


def test_atomic_create_json_never_replaces_and_one_of_racing_writers_wins(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from grpokit.common.io import atomic_create_json

    path = tmp_path / "base_vs_step_40.json"
    assert atomic_create_json(path, "first") and not atomic_create_json(path, "second")
    assert json.loads(path.read_text()) == "first"
    race = tmp_path / "race.json"
    with ThreadPoolExecutor(8) as pool:
        won = list(pool.map(lambda i: atomic_create_json(race, f"writer {i}"), range(32)))
    assert won.count(True) == 1 and json.loads(race.read_text()) == f"writer {won.index(True)}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base_vs_step_40.json", "race.json"]  # no temp files


def test_an_eval_report_never_overwrites_an_earlier_one(tmp_path):
    """Two evals of one checkpoint on different eval sets (the default name says only which weights ran)."""
    from grpokit.evaluate.report import write_new

    def doc(problems: int) -> dict:
        settings = {"k": 1, "problems": problems, "temperature": 0.0, "threshold": 1.0, "split": "eval"}
        settings |= {"level": 0.95, "resamples": 1000, "seed": 1234}
        return {"settings": settings, "models": {}, "comparison": None, "notes": []}

    first = write_new(doc(400), tmp_path / "base_vs_step_40.json")
    second = write_new(doc(100), tmp_path / "base_vs_step_40.json")
    assert [p.name for p in first] == ["base_vs_step_40.json", "base_vs_step_40.md"]
    assert [p.name for p in second] == ["base_vs_step_40-2.json", "base_vs_step_40-2.md"]
    assert json.loads(first[0].read_text())["settings"]["problems"] == 400
    assert json.loads(second[0].read_text())["settings"]["problems"] == 100
