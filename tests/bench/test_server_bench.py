"""`grpokit bench server` on the tiny model with tiny counts: a real `grpokit infer` subprocess answers every
request, and the result has finite, positive req/s and p50/p99 latency at each concurrency level."""

from __future__ import annotations

import json
import math
from pathlib import Path

from grpokit.bench.command import main

REPO = Path(__file__).resolve().parents[2]


def levels_ok(levels: dict, expected: list[int], requests: int) -> None:
    assert sorted(levels, key=int) == [str(c) for c in expected]
    for clients, s in levels.items():
        assert s["errors"] == 0 and s["requests"] == max(requests, int(clients)), s
        for key in ("req_per_s", "p50_ms", "p99_ms"):
            assert math.isfinite(s[key]) and s[key] > 0, (clients, key, s)
        assert s["p50_ms"] <= s["p99_ms"]


def test_server_bench_reports_req_per_s_and_latency_per_level(tmp_path, capsys):
    out = tmp_path / "server.json"
    argv = ["server", "--levels", "1,8,32", "--requests", "16", "--rounds", "1", "--warmup", "1"]
    assert main([*argv, "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert list(r["servers"]) == ["new"]
    levels_ok(r["servers"]["new"], [1, 8, 32], 16)
    assert r["versions"]["torch"] and r["versions"]["uvicorn"] and r["device"]
    assert "| 32 |" in capsys.readouterr().err  # the markdown table


def test_a_source_tree_runs_as_the_baseline(tmp_path):
    """--baseline-src starts `grpokit infer` from a source tree (here this very one), alternating with the
    installed server."""
    out = tmp_path / "server.json"
    argv = ["server", "--levels", "1,2", "--requests", "2", "--rounds", "2", "--warmup", "1"]
    assert main([*argv, "--baseline-src", str(REPO), "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    for name in ("new", "baseline"):
        levels_ok(r["servers"][name], [1, 2], 4)  # 2 rounds of 2
        assert len(r["servers"][name]["1"]["req_per_s_rounds"]) == 2
    assert r["settings"]["baseline_src"] == str(REPO)
