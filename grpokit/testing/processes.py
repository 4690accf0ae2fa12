"""A free loopback port, for a test or a bench that starts a server (grpokit/bench/server.py uses it)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback port the OS just handed out, for a server or rendezvous that binds a fixed port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
