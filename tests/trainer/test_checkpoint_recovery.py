"""Which checkpoint a resume takes, and what it sets aside: a bad newest checkpoint is passed over with a
warning, a run folder without checkpoints gets its own message, and the files of an abandoned history
move to archive/after_step_N_<time>/ (grpokit.trainer.checkpoint). The fits that exercise them end to end
are in tests/trainer/test_resume_recovery.py."""

import logging

import pytest
import torch

from grpokit.main import entry
from grpokit.testing import tiny_fit_argv
from grpokit.trainer.checkpoint import archive_abandoned_history, checkpoint_problem, resume_path


class NotATensor:
    """An object a weights-only load refuses to unpickle."""


def whole(path):
    """A small but real torch checkpoint (the zip archive torch.save writes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": {"w": torch.arange(4096.0)}, "global_step": 1}, path)
    return path


def truncated(path):
    whole(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # a copy cut short: the zip directory at the end is gone
    return path


def test_checkpoint_problem_names_empty_truncated_and_foreign_files(tmp_path):
    assert checkpoint_problem(whole(tmp_path / "good.ckpt")) is None
    (tmp_path / "empty.ckpt").write_bytes(b"")
    assert checkpoint_problem(tmp_path / "empty.ckpt") == "empty (0 bytes)"
    assert checkpoint_problem(truncated(tmp_path / "cut.ckpt")).startswith("truncated or not a checkpoint (")
    (tmp_path / "text.ckpt").write_text("not a checkpoint")
    assert "no complete zip archive" in checkpoint_problem(tmp_path / "text.ckpt")
    assert checkpoint_problem(tmp_path / "missing.ckpt").startswith("unreadable (")


def test_flipped_bytes_and_pickled_objects_are_found_before_a_resume_loads_them(tmp_path, caplog):
    """A checkpoint whose tensor bytes changed on disk (a CRC-32 mismatch) and one that pickles objects
    other than tensors (refused by a weights-only load) are passed over like a truncated one."""
    folder = tmp_path / "run" / "checkpoints"
    whole(folder / "step_2.ckpt")
    flipped = whole(folder / "step_4.ckpt")
    data = bytearray(flipped.read_bytes())
    at = data.find(torch.arange(4096.0)[100:104].numpy().tobytes())  # inside the tensor's record
    data[at : at + 8] = b"\xff" * 8
    flipped.write_bytes(bytes(data))
    assert checkpoint_problem(flipped).startswith("damaged (0 fails its CRC-32 check")
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": {}, "callback": NotATensor()}, folder / "step_6.ckpt")
    assert checkpoint_problem(folder / "step_6.ckpt").startswith("not loadable as weights only (UnpicklingError")
    with caplog.at_level(logging.WARNING, logger="grpokit.trainer.checkpoint"):
        assert resume_path(folder, -1) == (folder / "step_2.ckpt", 2)
    assert len(caplog.records) == 2


def test_newest_passes_over_bad_checkpoints_with_a_warning_naming_each(tmp_path, caplog):
    folder = tmp_path / "run" / "checkpoints"
    whole(folder / "step_2.ckpt")
    truncated(folder / "step_4.ckpt")
    (folder / "step_6.ckpt").write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="grpokit.trainer.checkpoint"):
        assert resume_path(folder, -1) == (folder / "step_2.ckpt", 2)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2
    assert "step_6.ckpt is empty (0 bytes); resuming from step_2.ckpt" in warnings[0]
    assert "step_4.ckpt is truncated or not a checkpoint" in warnings[1] and "step_2.ckpt" in warnings[1]


def test_an_explicit_step_is_never_replaced_by_another(tmp_path):
    folder = tmp_path / "run" / "checkpoints"
    whole(folder / "step_2.ckpt")
    truncated(folder / "step_4.ckpt")
    with pytest.raises(ValueError, match=r"ckpt.resume_step=4: .*step_4.ckpt is truncated .*another step \(\[2\]\)"):
        resume_path(folder, 4)
    assert resume_path(folder, 2) == (folder / "step_2.ckpt", 2)


def test_no_whole_checkpoint_at_all_lists_each_and_why(tmp_path):
    folder = tmp_path / "run" / "checkpoints"
    truncated(folder / "step_2.ckpt")
    (folder / "step_4.ckpt").write_bytes(b"")
    with pytest.raises(ValueError, match=r"no checkpoint in .* can be loaded: step_4.ckpt is empty .*; step_2.ckpt is"):
        resume_path(folder, -1)


def test_resuming_a_run_killed_before_its_first_checkpoint_says_so(tmp_path, tiny_model, capsys):
    """The folder exists (the run started) but has no checkpoint: not a typo in run_name, so no list of
    other runs; the fix is to start over under the same name."""
    whole(tmp_path / "other" / "checkpoints" / "step_2.ckpt")
    (tmp_path / "early" / "rollouts").mkdir(parents=True)
    (tmp_path / "early" / "rollouts" / "step_0.safetensors").write_bytes(b"a batch of the killed attempt")
    assert entry(tiny_fit_argv(tmp_path, tiny_model, "early", "--ckpt.resume_step", "-1")) == 2
    err = capsys.readouterr().err
    assert "the run folder" in err and "exists but has no checkpoint yet" in err
    assert "start it over with the same --run_name and no --ckpt.resume_step" in err
    assert "other" not in err and "Traceback" not in err
    assert (tmp_path / "early" / "rollouts" / "step_0.safetensors").exists()  # nothing of the attempt is touched

    assert entry(tiny_fit_argv(tmp_path, tiny_model, "erly", "--ckpt.resume_step", "-1")) == 2  # a typo
    err = capsys.readouterr().err
    assert "(no such run folder); set --run_name" in err and f"other in {tmp_path}" in err
    assert not (tmp_path / "erly").exists()


def batch_files(run, *steps):
    (run / "rollouts").mkdir(parents=True, exist_ok=True)
    for s in steps:
        (run / "rollouts" / f"step_{s}.safetensors").write_bytes(f"batch {s}".encode())


def names(folder):
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_an_older_checkpoint_sets_aside_later_checkpoints_and_every_batch_from_its_step(tmp_path):
    run = tmp_path / "run"
    for s in (2, 4, 6):
        whole(run / "checkpoints" / f"step_{s}.ckpt")
    batch_files(run, 1, 4, 5, 6, 7)
    archive = archive_abandoned_history(run, 4, batches=True)
    assert archive.parent == run / "archive" and archive.name.startswith("after_step_4_")
    assert names(archive / "checkpoints") == ["step_6.ckpt"]
    assert names(archive / "rollouts") == [f"step_{s}.safetensors" for s in (4, 5, 6, 7)]
    assert names(run / "checkpoints") == ["step_2.ckpt", "step_4.ckpt"]
    assert names(run / "rollouts") == ["step_1.safetensors"]


def test_the_newest_checkpoint_keeps_the_killed_runs_batches_up_to_a_gap(tmp_path):
    """After a kill the batches from the checkpoint on are the killed run's own, trained as they are; a
    batch after a missing step cannot be reached by replaying them, and a temp file is a dead writer's."""
    run = tmp_path / "run"
    whole(run / "checkpoints" / "step_4.ckpt")
    batch_files(run, 4, 5, 6)
    assert archive_abandoned_history(run, 4, batches=True) is None
    assert names(run / "rollouts") == [f"step_{s}.safetensors" for s in (4, 5, 6)]

    batch_files(run, 8, 9)
    (run / "rollouts" / ".step_7.safetensors.k3j1.tmp").write_bytes(b"half a batch")
    archive = archive_abandoned_history(run, 4, batches=True)
    assert names(archive / "rollouts") == ["step_8.safetensors", "step_9.safetensors"]
    assert names(run / "rollouts") == [f"step_{s}.safetensors" for s in (4, 5, 6)]


def test_the_trainer_of_a_multi_process_run_leaves_the_orchestrators_batches(tmp_path):
    run = tmp_path / "run"
    for s in (2, 4):
        whole(run / "checkpoints" / f"step_{s}.ckpt")
    batch_files(run, 2, 3, 4)
    archive = archive_abandoned_history(run, 2, batches=False)
    assert names(archive) == ["checkpoints"] and names(run / "rollouts") == [f"step_{s}.safetensors" for s in (2, 3, 4)]
