"""`grpokit bench server`: requests/s and p50/p99 latency of `grpokit infer`'s HTTP server at a few client
concurrencies, and side by side those of an older grpokit's server (`--baseline-src`), in one invocation.

Each server is a real `grpokit infer` process on loopback (the shipped reverse-text recipe with the
multi-process overlay, the builtin engine on the CPU, `--num_threads`), serving the tiny random model of
the tests (2 layers, hidden 64, SmolLM2's tokenizer) or `--model`. Clients are threads of this process,
one new connection per request (http.client), each request `POST /v1/completions` with a fixed 4-token
prompt, `max_tokens` = `min_tokens` = `--max-tokens`, `logprobs` 0 and `return_token_ids`: the shape of
RemoteEngine's requests. A level runs `--requests` requests (at least one per client) spread over its
clients; req/s is requests over the level's wall time, latency is per request, send to last byte.

Both servers start first and stay up; each gets `--warmup` requests, then every round measures each level
on both, back to back, the order flipping every round (A B, B A, ...) so drift cancels. Reported per server
and level: req/s over all rounds (and each round's), p50/p99 of the latencies of all rounds, errors.

`--src` measures another source tree's server as "new" instead of this grpokit's (a clean worktree of a
commit, say, while this tree has edits in progress). A source tree (a git worktree) runs in place: its
`grpokit`, `registry/`, `envs/` and `recipes/` folders are imported instead of the installed ones (an
editable install would otherwise map grpokit.registry to this tree), with that tree's own recipes.
"""

from __future__ import annotations

import http.client
import importlib.metadata
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

from grpokit.testing import build_tiny_model, free_port

PROMPT = [1, 520, 9531, 198]
# runs `grpokit ARGS` from the source tree given as its first argument (see the module docstring)
BOOT = """import importlib.util, runpy, sys
from pathlib import Path
src = Path(sys.argv.pop(1))
dirs = {"grpokit": "grpokit", "grpokit.registry": "registry", "grpokit.envs": "envs", "grpokit.recipes": "recipes"}
class SourceTree:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name in dirs:
            d = src / dirs[name]
            return importlib.util.spec_from_file_location(name, d / "__init__.py", submodule_search_locations=[str(d)])
sys.meta_path.insert(0, SourceTree)
sys.argv[0] = "grpokit"
runpy.run_module("grpokit", run_name="__main__", alter_sys=True)
"""


def infer_argv(src: Path | None, model: str, port: int, out_dir: Path, run_name: str, threads: int) -> list[str]:
    """`grpokit infer` of this grpokit (src None) or of the source tree `src`, with its own recipes."""
    if src is None:
        from importlib.resources import files

        recipes, argv = files("grpokit.recipes"), [sys.executable, "-m", "grpokit"]
    else:
        recipes, argv = src / "recipes", [sys.executable, "-c", BOOT, str(src)]
    argv += ["infer", "--config", str(recipes / "reverse_text.yaml"), "--config", str(recipes / "multi_process.yaml")]
    argv += ["--output_dir", str(out_dir), "--run_name", run_name, "--model.model", model]
    return argv + ["--server.port", str(port), "--num_threads", str(threads)]


class Server:
    """One `grpokit infer` subprocess on a free loopback port; `stop()` sends SIGTERM (then SIGKILL)."""

    def __init__(self, name: str, src: Path | None, model: str, folder: Path, threads: int) -> None:
        self.name, self.port, self.log = name, free_port(), folder / f"{name}.log"
        env = dict(os.environ)
        if src is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(src), *filter(None, [env.get("PYTHONPATH")])])
        argv = infer_argv(src, model, self.port, folder, name, threads)
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=folder)

    def wait_ready(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log.read_text()[-3000:]
                raise RuntimeError(f"server {self.name} did not come up (exit {self.proc.poll()}):\n{tail}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def one_request(port: int, body: bytes) -> tuple[float, str | None]:
    """Seconds from connecting to the answer's last byte, and None for a 200 with one choice, else the error."""
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
        error = None if response.status == 200 and len(json.loads(data)["choices"]) == 1 else f"HTTP {response.status}"
    except (OSError, http.client.HTTPException, ValueError, KeyError) as e:
        error = type(e).__name__
    finally:
        conn.close()
    return time.perf_counter() - start, error


def load(port: int, body: bytes, clients: int, requests: int) -> dict:
    """`requests` requests from `clients` threads, each sending its next request when the last is answered;
    the latencies of the answered ones, and the failed ones' errors."""
    lock, latencies, errors = threading.Lock(), [], []
    left = [max(requests, clients)]

    def client() -> None:
        while True:
            with lock:
                if left[0] == 0:
                    return
                left[0] -= 1
            seconds, error = one_request(port, body)
            with lock:
                if error:
                    errors.append(error)
                else:
                    latencies.append(seconds)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"seconds": time.perf_counter() - start, "latencies": latencies, "errors": errors}


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 100]) in milliseconds; None of no values."""
    ordered = sorted(values)
    return 1e3 * ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)] if ordered else None


def summarize(rounds: list[dict]) -> dict:
    """Answered requests per second and their latency percentiles over all rounds; failures by error."""
    latencies, errors = [x for r in rounds for x in r["latencies"]], [e for r in rounds for e in r["errors"]]
    seconds = sum(r["seconds"] for r in rounds)
    return {
        "requests": len(latencies),
        "errors": len(errors),
        "error_kinds": {e: errors.count(e) for e in sorted(set(errors))},
        "req_per_s": len(latencies) / seconds,
        "req_per_s_rounds": [len(r["latencies"]) / r["seconds"] for r in rounds],
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "mean_ms": 1e3 * sum(latencies) / len(latencies) if latencies else None,
    }


def measure(servers: list[Server], body: bytes, levels: list[int], requests: int, rounds: int, warmup: int) -> dict:
    """Warm each server up, then `rounds` rounds of every level on every server, the order flipping per round."""
    for server in servers:
        load(server.port, body, 1, warmup)
    raw = {s.name: {c: [] for c in levels} for s in servers}
    for r in range(rounds):
        for clients in levels:
            for server in servers if r % 2 == 0 else servers[::-1]:
                raw[server.name][clients].append(load(server.port, body, clients, requests))
    return {name: {str(c): summarize(per_level[c]) for c in levels} for name, per_level in raw.items()}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(new_src: Path | None, baseline: Path | None) -> dict:
    versions = {"python": platform.python_version()}
    for package in ("torch", "uvicorn", "starlette", "transformers"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "device": f"{cpu_model()} ({os.cpu_count()} cores)",
        "versions": versions,
        "commit": git_commit(new_src or Path(__file__).resolve().parents[2]),
        "baseline_commit": git_commit(baseline) if baseline is not None else None,
        "load_average": os.getloadavg(),
    }


def git_commit(tree: Path) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except OSError:
        return None
    return out.stdout.strip() or None


def run(
    model: str = "tiny",
    levels: tuple[int, ...] = (1, 8, 32),
    requests: int = 64,
    rounds: int = 3,
    warmup: int = 8,
    max_tokens: int = 8,
    threads: int = 1,
    baseline_src: str | None = None,
    src: str | None = None,
) -> dict:
    """Measure this grpokit's server (or the tree `src`'s) and, with `baseline_src`, that tree's too."""
    new_src = Path(src).resolve() if src else None
    baseline = Path(baseline_src).resolve() if baseline_src else None
    body = json.dumps(
        {"prompt": PROMPT, "max_tokens": max_tokens, "min_tokens": max_tokens, "logprobs": 0, "return_token_ids": True}
    ).encode()
    before = environment(new_src, baseline)
    with tempfile.TemporaryDirectory(prefix="grpokit-bench-server-") as tmp, ExitStack() as stack:
        folder = Path(tmp)
        path = str(build_tiny_model(folder / "tiny")) if model == "tiny" else model
        servers = [Server("new", new_src, path, folder, threads)]
        if baseline is not None:
            servers.append(Server("baseline", baseline, path, folder, threads))
        for server in servers:
            stack.callback(server.stop)
        for server in servers:
            server.wait_ready()
        results = measure(servers, body, list(levels), requests, rounds, warmup)
    settings = dict(model=model, levels=list(levels), requests=requests, rounds=rounds, warmup=warmup)
    settings.update(max_tokens=max_tokens, threads=threads, baseline_src=str(baseline) if baseline else None)
    settings["src"] = str(new_src) if new_src else None
    result = {**before, "load_average_after": os.getloadavg(), "settings": settings, "servers": results}
    print(table(result), file=sys.stderr)
    return result


def table(result: dict) -> str:
    """A markdown table: per level, each server's req/s (each round's), p50 and p99, and new / baseline."""
    servers = result["servers"]
    names = [n for n in ("baseline", "new") if n in servers]
    head = "| clients | " + " | ".join(f"{n}: req/s (rounds), p50, p99" for n in names)
    lines = [head + (" | new/baseline req/s |" if len(names) == 2 else " |")]
    lines.append("|---" * (len(names) + 1 + (len(names) == 2)) + "|")
    for level in result["settings"]["levels"]:
        cells = []
        for n in names:
            cells.append(cell(servers[n][str(level)]))
        if len(names) == 2:
            new, old = servers["new"][str(level)], servers["baseline"][str(level)]
            cells.append(f"{new['req_per_s'] / old['req_per_s']:.2f}")
        lines.append(f"| {level} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cell(s: dict) -> str:
    rounds = "/".join(f"{x:.1f}" for x in s["req_per_s_rounds"])
    p50, p99 = (f"{s[k]:.0f} ms" if s[k] is not None else "-" for k in ("p50_ms", "p99_ms"))
    errors = "".join(f", {n} x {kind}" for kind, n in s["error_kinds"].items())
    return f"{s['req_per_s']:.1f} ({rounds}), {p50}, {p99}{errors}"
