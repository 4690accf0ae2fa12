"""`grpokit judge`: the fourth role of a multi-process run, the recipe's judge served at its base_url.

    grpokit judge --config r.yaml [--name JUDGE]

It reads the recipe as every role does (its overlays and flags), serves the one judge of `data.env` whose
`judge.base_url` is set (grpokit.judges.server), and runs until SIGTERM or Ctrl-C. It needs no run name:
the judge's weights are its own and never updated, so nothing of the run's folder is read.
"""

from __future__ import annotations

import logging
import signal

import torch
import yaml

from grpokit.cli.lightning_cli import parse_recipe
from grpokit.cli.roles import exit_now, interrupt
from grpokit.inference.server.limits import ServerLimits

log = logging.getLogger(__name__)


def judge(argv: list[str], startup) -> int:
    """Serve the recipe's judge (`data.env[i].judge` with a `base_url`; `--name N` picks one of several)
    at its base_url's host and port until SIGTERM or Ctrl-C (grpokit.judges.server). The judge's model is
    its own, frozen: this role never reads a broadcast, so it needs no run name."""
    from grpokit.judges.server import judge_server, served_judge  # starlette + uvicorn: the servers only

    name, argv = pop_option(argv, "--name")
    recipe = yaml.safe_load(parse_recipe(argv))
    settings, (host, port) = served_judge(recipe, name)
    if recipe.get("num_threads"):
        torch.set_num_threads(recipe["num_threads"])
    server_settings = recipe.get("server") or {}
    limits = ServerLimits(**server_settings.get("limits", {}))
    guard = {k: server_settings.get(k) for k in ("allowed_hosts", "allowed_origins") if server_settings.get(k)}
    signal.signal(signal.SIGTERM, interrupt)  # until serving: then uvicorn stops gracefully and re-raises it
    try:
        server = judge_server(settings, host, port, limits, **guard)
        startup.started = True
        log.info("serving judge %r (%s, %s) at %s", settings.name, settings.kind, settings.model, server.url)
        try:
            server.serve_forever()
        finally:
            server.close()
    except KeyboardInterrupt:
        log.info("judge server stopped")
    exit_now(0)


def pop_option(argv: list[str], flag: str) -> tuple[str | None, list[str]]:
    """`flag`'s value (`--flag V` or `--flag=V`) and argv without it."""
    out, value, i = [], None, 0
    while i < len(argv):
        if argv[i] == flag and i + 1 < len(argv):
            value, i = argv[i + 1], i + 2
            continue
        if argv[i].startswith(flag + "="):
            value = argv[i].split("=", 1)[1]
        else:
            out.append(argv[i])
        i += 1
    return value, out
