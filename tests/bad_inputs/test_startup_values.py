"""Recipe values that used to run silently wrong, or fail late with a library's traceback, are refused
by the `grpokit` command at start with one line naming the key and the fix (exit 2), before any sampling.

Run through `grpokit.main.entry` (what the console script calls) on the tiny model.
"""

import contextlib
import json
import os
import re
import subprocess

import pytest

from grpokit.inference.builtin import BuiltinEngine
from grpokit.main import entry
from grpokit.testing import tiny_fit_argv

CASES = [
    (["--data.rollouts_per_example", "0"], r"data.rollouts_per_example must be >= 1 .* got 0"),
    (
        ["--data.rollouts_per_example", "1"],
        r"data.rollouts_per_example is 1, and data.advantage GroupNorm gives a group of one rollout advantage 0 "
        r"\(nothing would be learned\): set data.rollouts_per_example >= 2",
    ),
    (["--data.sampling.stop", "['']"], r"data.sampling.stop must be non-empty strings, got \[''\]"),
    (
        ["--data.sampling.max_tokens", "200"],
        r"data.sampling.max_tokens \(200\) must be below data.seq_len \(128\).*raise data.seq_len",
    ),
    (["--model.max_grad_norm", "-1"], r"model.max_grad_norm must be >= 0 \(0 disables clipping\), got -1"),
    (["--model.warmup_steps", "-5"], r"model.warmup_steps must be >= 0, got -5"),
    (["--model.lr", "-1"], r"model.lr must be > 0, got -1"),
    (["--data.eval.interval", "0"], r"data.eval.interval must be >= 1, got 0; set data.eval: null"),
    (["--model.lora.rank", "0"], r"model.lora.rank must be >= 1, got 0 \(set model.lora: null"),
    (
        ["--model.lora.target_modules", "[q_proj, v_prj]"],
        r"model.lora.target_modules \['v_prj'\]: the model has no module of that name; its layers are \[.*'v_proj'",
    ),
    (
        ["--data.kl_in_reward.coef", "-1"],
        r"data.kl_in_reward.coef must be a finite number >= 0, got -1.0; set e.g. 0.001, or data.kl_in_reward: null",
    ),
    (["--data.timeout", ".nan"], r"data.timeout must be a finite number of seconds > 0, got nan"),
    (["--data.weights_timeout", ".inf"], r"data.weights_timeout must be a finite number of seconds > 0, got inf"),
    (["--model.lora.alpha", "-16"], r"model.lora.alpha must be a finite number > 0 .*got -16"),
    (["--data.num_logged_samples", "-1"], r"data.num_logged_samples must be >= 0 \(0 logs none\), got -1"),
    (
        ["--data.env", "[{id: reverse-text}, {id: reverse-text}]"],
        r"data.env names the environment\(s\) \['reverse-text'\] more than once .*give each entry its own `name`",
    ),
    (
        ["--data.env", "[{id: reverse-text, ratio: .nan}]"],
        r"data.env 'reverse-text': ratio must be a finite number >= 0 .*got nan",
    ),
    (
        ["--data.advantage", "Process", "--data.kl_in_reward.coef", "0.1"],
        r"data.kl_in_reward shapes each rollout's reward, which data.advantage Process does not read",
    ),
]


@pytest.mark.parametrize("overrides,message", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_a_bad_value_is_refused_at_start_naming_the_key(tmp_path, tiny_model, capsys, overrides, message):
    argv = tiny_fit_argv(tmp_path, tiny_model, "r", "--trainer.max_steps", "1", *overrides)
    assert entry(argv) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err[-3000:]
    assert "Traceback" not in err
    if "target_modules" not in overrides[0]:  # known from the recipe alone: refused before any sampling
        assert not (tmp_path / "r" / "rollouts").exists()


def test_an_abbreviated_option_is_not_taken_for_the_full_one(tmp_path, tiny_model, capsys):
    """argparse would read `--trainer.max_step 5` as trainer.max_steps (prefix matching)."""
    with pytest.raises(SystemExit) as info:
        entry(tiny_fit_argv(tmp_path, tiny_model, "r", "--trainer.max_step", "5"))
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --trainer.max_step 5" in err and "did you mean --trainer.max_steps" in err


@pytest.mark.parametrize("run_name", ["../escaped", "a/b", ".."])
def test_a_run_name_that_leaves_output_dir_is_refused(tmp_path, tiny_model, capsys, run_name):
    out = tmp_path / "out"
    assert entry(tiny_fit_argv(out, tiny_model, run_name)) == 2
    assert f"run_name {run_name!r} must be one plain folder name" in capsys.readouterr().err
    assert not (tmp_path / "escaped").exists() and not (out / "a").exists()


def test_an_output_dir_under_a_file_is_refused(tmp_path, tiny_model, capsys):
    (tmp_path / "file").write_text("x")
    assert entry(tiny_fit_argv(tmp_path / "file" / "out", tiny_model, "r")) == 2
    assert "cannot create or write run folders in" in capsys.readouterr().err


@contextlib.contextmanager
def read_only_folder(path):
    """`path`, read-only to this process: mode 555, or, for root (which writes through modes), a
    read-only tmpfs mounted on it; the test skips where root may not mount."""
    path.mkdir()
    if os.geteuid() != 0:
        path.chmod(0o555)
        try:
            yield path
        finally:
            path.chmod(0o755)
        return
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)], capture_output=True)
    except OSError:  # no mount command
        pytest.skip("root without a mount command: no read-only folder to test with")
    if mounted.returncode != 0:
        pytest.skip(f"root may not mount a read-only tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def test_a_read_only_output_dir_is_refused(tmp_path, tiny_model, capsys):
    with read_only_folder(tmp_path / "ro") as out:
        assert entry(tiny_fit_argv(out, tiny_model, "r")) == 2
    assert "not a writable folder" in capsys.readouterr().err


def test_a_dataset_line_that_is_not_utf8_is_refused_before_the_model_loads(tmp_path, tiny_model, capsys, monkeypatch):
    data = tmp_path / "latin1.jsonl"
    data.write_bytes(b'{"question": "a", "answer": "b"}\n{"question": "caf\xe9", "answer": "b"}\n')

    def no_model(self, *args, **kwargs):
        raise AssertionError("the engine loaded the model before the dataset was read")

    monkeypatch.setattr(BuiltinEngine, "setup", no_model)
    env = json.dumps([{"id": "jsonl", "args": {"path": str(data)}}])
    assert entry(tiny_fit_argv(tmp_path, tiny_model, "r", "--data.env", env)) == 2
    err = capsys.readouterr().err
    assert f"jsonl: {data} line 2: not UTF-8 (byte 0xe9 at character 18); save the file as UTF-8" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("command", ["infer", "fit"])
def test_a_server_port_outside_the_tcp_range_is_refused_before_the_model_loads(
    tmp_path, tiny_model, capsys, monkeypatch, command
):
    """`grpokit infer --server.port 70000` used to load the model, then fail binding with socket's
    OverflowError traceback."""

    def no_model(self, *args, **kwargs):
        raise AssertionError("the engine loaded the model before server.port was checked")

    monkeypatch.setattr(BuiltinEngine, "setup", no_model)
    argv = tiny_fit_argv(tmp_path, tiny_model, "r", "--server.port", "70000", command=command)
    assert entry(argv) == 2
    err = capsys.readouterr().err
    assert "server.port must be a TCP port in [1, 65535], got 70000; set server.port to a free port" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "env_id,why",
    [("json", "exports no verifiers Taskset subclass in `__all__`"), ("grpokit", "defines no `__all__`")],
)
def test_a_data_env_id_naming_a_module_that_is_no_environment_is_refused_before_the_model_loads(
    tmp_path, tiny_model, capsys, monkeypatch, env_id, why
):
    """`data.env [{id: json}]` used to end the start with verifiers' TypeError traceback."""

    def no_model(self, *args, **kwargs):
        raise AssertionError("the engine loaded the model before data.env was checked")

    monkeypatch.setattr(BuiltinEngine, "setup", no_model)
    assert entry(tiny_fit_argv(tmp_path, tiny_model, "r", "--data.env", json.dumps([{"id": env_id}]))) == 2
    err = capsys.readouterr().err
    assert f"data.env id {env_id!r} names the module {env_id!r}, which is not an environment (it {why}" in err
    assert "set data.env id to a built-in environment (" in err and "reverse-text" in err
    assert "Traceback" not in err


def test_an_empty_model_folder_names_model_model(tmp_path, capsys):
    empty = tmp_path / "empty_model"
    empty.mkdir()
    assert entry(tiny_fit_argv(tmp_path, str(empty), "r")) == 2
    assert "the folder has no config.json, so it is not a saved model" in capsys.readouterr().err


@pytest.mark.unit
@pytest.mark.parametrize("seconds", [float("nan"), float("inf"), 0, -1.0, True])
def test_every_timeout_is_a_finite_number_of_seconds(seconds):
    """A NaN timeout compares false with every clock reading, so a wait bounded by it never ends; each
    component's timeout is refused at construction naming its key."""
    from grpokit.broadcast.nccl import NCCLBroadcast
    from grpokit.inference.remote import RemoteEngine
    from grpokit.transport.zmq import ZMQTransport

    builds = {
        "inference.init_args.timeout": lambda: RemoteEngine("http://127.0.0.1:1/v1", timeout=seconds),
        "data.transport send_timeout": lambda: ZMQTransport(send_timeout=seconds),
        "data.transport close_timeout": lambda: ZMQTransport(close_timeout=seconds),
        "broadcast.init_args.timeout": lambda: NCCLBroadcast(backend="gloo", timeout=seconds),
    }
    for key, build in builds.items():
        with pytest.raises(ValueError, match=re.escape(f"{key} must be a finite number of seconds > 0")):
            build()
