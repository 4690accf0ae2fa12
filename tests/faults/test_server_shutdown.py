"""SIGTERM stops `grpokit infer` within a few seconds while the engine runs a long request: the listener
closes, the queued request is answered 503 at once, the running one after server.limits.shutdown_timeout
(3 s), and the process exits 0 without waiting for the engine to finish."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from grpokit.testing import free_port

REPO = Path(__file__).resolve().parents[2]
LONG = {"prompt": [[1, 520, 9531, 198]] * 4, "n": 256, "max_tokens": 500, "min_tokens": 500}  # 1024 rows x 500


def get(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.loads(r.read())
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def post(url: str, body: dict, out: list) -> None:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            out.append((r.status, r.headers.get("Retry-After")))
    except urllib.error.HTTPError as e:
        out.append((e.code, e.headers.get("Retry-After")))
    except (urllib.error.URLError, ConnectionError) as e:
        out.append((None, str(e)))


def test_sigterm_stops_the_server_within_5s_while_a_long_request_runs(tmp_path, tiny_model):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "grpokit", "infer", "--config", str(REPO / "recipes/reverse_text.yaml")]
    argv += ["--config", str(REPO / "recipes/multi_process.yaml"), "--output_dir", str(tmp_path), "--run_name", "t"]
    argv += ["--model.model", tiny_model, "--server.port", str(port)]
    log = tmp_path / "infer.log"
    proc = subprocess.Popen(argv, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while get(base + "/health") is None:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        running, queued = [], []
        threading.Thread(target=post, args=(base + "/v1/completions", LONG, running), daemon=True).start()
        while (get(base + "/health") or {}).get("running_s") is None:
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
        threading.Thread(target=post, args=(base + "/v1/completions", LONG, queued), daemon=True).start()
        while (get(base + "/health") or {}).get("queued") != 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        elapsed = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, log.read_text()[-3000:]
    assert elapsed < 5.0, f"{elapsed:.1f}s"
    time.sleep(0.5)
    assert queued and queued[0][0] == 503 and queued[0][1] is not None  # answered at once, with Retry-After
    assert running and running[0][0] in (503, None)  # answered 503 after shutdown_timeout (or cut off at exit)
    print(f"SIGTERM to exit: {elapsed:.2f}s")
