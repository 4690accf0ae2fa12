"""What the judge tests share: a dead endpoint's address and a chat completion answer for ScriptedServer."""

import socket


def dead_url() -> str:
    """The address of a loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def answer(text: str) -> dict:
    """A chat completion whose reply is `text`."""
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}
