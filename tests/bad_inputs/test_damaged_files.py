"""Files damaged between a run and its resume, with bytes flipped near their end (a bad disk or copy):
their layout still parses, so only the content checksums tell. A batch file is refused naming the file
and the step (before: it trained, loss -2.7e-26, grad norm 0, kl inf); a weights file of a published
step is refused naming the file and the step before any engine loads it. Each stops the resumed
`grpokit fit` with exit 1 and one line, and nothing is trained on it.

Run through `grpokit.main.entry` (what the console script calls) on the tiny model.
"""

from pathlib import Path

from grpokit.transport.codec import decode_batch, encode_batch
from tests.bad_inputs import test_run_files
from tests.bad_inputs.test_run_files import resumed, trained_steps

two_steps = test_run_files.two_steps  # the finished 2-step run both files damage, as a fixture here too


def flip_near_end(path: Path, count: int = 1000) -> None:
    data = path.read_bytes()
    count = min(count, len(data) // 2)
    path.write_bytes(data[:-count] + bytes(b ^ 0xFF for b in data[-count:]))


def test_a_batch_file_with_bytes_flipped_near_its_end_stops_the_resume_naming_it(
    two_steps, tmp_path, tiny_model, capsys
):
    def damage(run):
        rollouts = run / "rollouts"
        batch = decode_batch((rollouts / "step_1.safetensors").read_bytes())
        batch.step = 2  # the batch of step 2 the killed orchestrator had written, then damaged on disk
        (rollouts / "step_2.safetensors").write_bytes(encode_batch(batch))
        flip_near_end(rollouts / "step_2.safetensors")

    code, run = resumed(two_steps, tmp_path, tiny_model, damage)
    err = capsys.readouterr().err
    assert code == 1, err[-3000:]
    assert "Traceback" not in err
    assert "rollouts/step_2.safetensors: the batch of step 2 is damaged" in err, err[-3000:]
    assert "delete it and resume the run" in err
    assert trained_steps(run) == [0, 1]


def test_a_weights_file_with_bytes_flipped_near_its_end_stops_the_resume_naming_it(
    two_steps, tmp_path, tiny_model, capsys
):
    def damage(run):
        for step in (1, 2):  # the weights the resumed orchestrator samples with (max_async_level 1)
            flip_near_end(run / "broadcasts" / f"step_{step}" / "adapter_model.safetensors")

    code, run = resumed(two_steps, tmp_path, tiny_model, damage)
    err = capsys.readouterr().err
    assert code == 1, err[-3000:]
    assert "Traceback" not in err
    assert "adapter_model.safetensors is not what the trainer published" in err, err[-3000:]
    assert "FilesystemBroadcast step " in err
    assert trained_steps(run) == [0, 1]
