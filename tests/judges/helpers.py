"""What the judge tests share: a dead endpoint's address, a chat completion answer for ScriptedServer, and
a 2-step fit of the judge recipe on tiny models."""

import json
import socket
from pathlib import Path

JUDGE_RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "judge_exclaim.yaml"


def dead_url() -> str:
    """The address of a loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def answer(text: str) -> dict:
    """A chat completion whose reply is `text`."""
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}


def judge_fit_argv(tmp_path, tiny_model: str, run_name: str, env: dict, max_tokens: int = 8) -> list[str]:
    """`grpokit fit` (for grpokit.main.main) of recipes/judge_exclaim.yaml for 2 steps on the tiny model,
    2 prompts x 4 rollouts, with `env` as its one data.env entry."""
    return [
        "fit", "--config", str(JUDGE_RECIPE), "--output_dir", str(tmp_path), "--run_name", run_name,
        "--model.model", tiny_model, "--model.lora.rank", "4", "--data.batch_size", "8",
        "--data.rollouts_per_example", "4", "--data.sampling.max_tokens", str(max_tokens), "--data.seq_len", "128",
        "--trainer.enable_progress_bar", "false", "--trainer.max_steps", "2", "--data.env", json.dumps([env]),
    ]  # fmt: skip
