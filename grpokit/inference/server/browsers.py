"""Requests a web page could make: refused unless configured.

A page the user visits can POST `text/plain` to http://127.0.0.1:8000 without a CORS preflight (a "simple"
request), and a DNS-rebinding page can reach the loopback server under its own host name. Neither is a
client of grpokit's server, whose clients (the orchestrator, the OpenAI SDK, curl) send no `Origin` and
name the address they connect to in `Host`. So, like vLLM's and Jupyter's servers behind their allow-lists:
- a request carrying an `Origin` header is refused (403) unless the origin is in `server.allowed_origins`;
- when the server listens on a loopback address, a `Host` that is not a loopback name (localhost,
  127.0.0.1, [::1]) or in `server.allowed_hosts` is refused (403). A server bound to another address is
  reachable under any name its network gives it, so its hosts are checked only when allowed_hosts is set.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from grpokit.inference.server.errors import RequestError

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def host_name(host_header: str) -> str:
    """The name in a Host header, without its port: "127.0.0.1:8000" -> "127.0.0.1", "[::1]:80" -> "::1"."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


@dataclass(frozen=True)
class BrowserGuard:
    """Which Host and Origin headers the server answers (see the module docstring)."""

    allowed_hosts: frozenset[str] | None  # None: any host; "*" in the list also allows any
    allowed_origins: frozenset[str]  # "*": any origin

    @classmethod
    def for_address(cls, bind_host: str, allowed_hosts: list[str] | None, allowed_origins: list[str]) -> BrowserGuard:
        """The guard of a server listening on `bind_host`: loopback names only when that is a loopback
        address and allowed_hosts is not set."""
        if allowed_hosts is None:
            hosts = LOOPBACK_NAMES | {bind_host.lower()} if is_loopback(bind_host) else None
        else:
            hosts = None if "*" in allowed_hosts else frozenset(h.lower() for h in allowed_hosts)
        return cls(hosts, frozenset(o.rstrip("/").lower() for o in allowed_origins))

    def check(self, headers) -> None:
        """Raise RequestError(403) for a request whose Host or Origin this server does not answer."""
        origin = headers.get("origin")
        allowed = "*" in self.allowed_origins or (origin or "").rstrip("/").lower() in self.allowed_origins
        if origin is not None and not allowed:
            raise RequestError(
                f"cross-origin request from {origin[:100]!r} refused: a web page may not drive this server; "
                "add the origin to server.allowed_origins if it should",
                status=403,
            )
        if self.allowed_hosts is not None and "host" in headers:  # HTTP/1.0 clients may send none; browsers do
            name = host_name(headers["host"])
            if name not in self.allowed_hosts:
                raise RequestError(
                    f"Host {name[:100]!r} refused: this server answers {sorted(self.allowed_hosts)} "
                    "(server.allowed_hosts); a page under another name may be rebinding DNS to it",
                    status=403,
                )
