"""Atomic writes of a path-taking writer and of folders: a reader sees the old or the whole new one."""

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
