"""Security defaults, checked over every module of the package (so new code is held to them too):
sockets bind loopback unless `host` is set; nothing unpickles data; API keys come only from environment
variables that the recipe names; no string is executed as code (class paths and environment ids,
imported by name, are the documented way to run user code)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from grpokit.inference import SamplingSettings
from grpokit.inference.remote import RemoteEngine
from tests.support import ScriptedServer

REPO = Path(__file__).resolve().parents[1]
SOURCES = sorted(p for folder in ("grpokit", "registry", "envs") for p in (REPO / folder).rglob("*.py"))
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
UNPICKLERS = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "marshal", "shelve", "joblib"}
PICKLING_CALLS = {
    "broadcast_object_list",
    "scatter_object_list",
    "gather_object",
    "all_gather_object",
    "send_object_list",
    "recv_object_list",
    "unsafe_load",
    "full_load",
}
ENV_VARS = {
    "PL_GLOBAL_SEED": "the recipe's seed, set by LightningCLI",
    "GRPOKIT_CACHE": "where converted models are cached",
    "GRPOKIT_TRACEBACK": "show the traceback of a start-up error (grpokit.main.entry)",
    "GRPOKIT_LOG_LEVEL": "the level of grpokit's own log lines on stderr (grpokit.main.show_grpokit_logs)",
    "JSONARGPARSE_DEBUG": "jsonargparse's debug mode: its own parse errors, not grpokit.cli.errors' short ones",
    "RANK": "torchrun's global rank",
    "LOCAL_RANK": "the launcher's local rank",
    "NODE_RANK": "the launcher's node rank",
}
SECRET_ARG = re.compile(r"(^|_)(api_?key|secret|password|passwd|auth_?token|bearer)$", re.IGNORECASE)


def trees():
    for path in SOURCES:
        yield path.relative_to(REPO), ast.parse(path.read_text(), filename=str(path))


def calls(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            yield node, name, ast.unparse(func)


def keyword(node: ast.Call, name: str):
    return next((k.value for k in node.keywords if k.arg == name), None)


def test_sockets_bind_loopback_unless_host_is_set():
    found = []
    for path, tree in trees():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args.args + node.args.kwonlyargs
                defaults = (
                    [None] * (len(node.args.args) - len(node.args.defaults))
                    + node.args.defaults
                    + node.args.kw_defaults
                )
                found += [
                    (path, a.arg, d) for a, d in zip(args, defaults) if a.arg in ("host", "bind_host") and d is not None
                ]
            elif (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and node.target.id == "host"
                and node.value is not None
            ):
                found += [(path, "host", node.value)]
    assert found, "no host settings found: the scan is broken"
    exposed = [
        (str(p), name, ast.unparse(d))
        for p, name, d in found
        if not (isinstance(d, ast.Constant) and d.value in LOOPBACK)
    ]
    assert not exposed, f"these default to a non-loopback address: {exposed}"
    for recipe in (REPO / "recipes").rglob("*.yaml"):
        hosts = re.findall(r"^\s*host:\s*(\S+)", recipe.read_text(), re.MULTILINE)
        assert set(hosts) <= LOOPBACK, f"{recipe.name} exposes a socket: host {hosts}"


def test_nothing_is_unpickled():
    problems = []
    for path, tree in trees():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + (
                    [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
                )
                problems += [f"{path}:{node.lineno} imports {n}" for n in names if n.split(".")[0] in UNPICKLERS]
        for node, name, text in calls(tree):
            only_weights = keyword(node, "weights_only")
            if text == "torch.load" and not (isinstance(only_weights, ast.Constant) and only_weights.value is True):
                problems.append(f"{path}:{node.lineno} torch.load without weights_only=True")
            if name == "load" and text.startswith(("np.", "numpy.")) and keyword(node, "allow_pickle") is not None:
                problems.append(f"{path}:{node.lineno} numpy load with allow_pickle")
            if text == "yaml.load" or name in PICKLING_CALLS:
                problems.append(f"{path}:{node.lineno} {text} (unpickles or builds arbitrary objects)")
    assert not problems, problems


def test_no_string_is_executed_as_code():
    problems = []
    for path, tree in trees():
        for node, _name, text in calls(tree):
            if text in ("eval", "exec", "compile", "__import__", "os.system", "os.popen"):
                problems.append(f"{path}:{node.lineno} {text}()")
            shell = keyword(node, "shell")
            if isinstance(shell, ast.Constant) and shell.value is True:
                problems.append(f"{path}:{node.lineno} {text}(shell=True)")
    assert not problems, problems


def test_secrets_come_only_from_environment_variables_named_in_the_recipe():
    problems = []
    for path, tree in trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.arg) and SECRET_ARG.search(node.arg):
                problems.append(
                    f"{path}:{node.lineno} takes a secret as argument {node.arg!r}: "
                    f"take the name of an environment variable (`{node.arg}_var`)"
                )
        for node, _name, text in calls(tree):
            if text in ("os.environ.get", "os.getenv"):
                problems += env_read_problem(path, node, node.args[0] if node.args else None)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Subscript)
                and ast.unparse(node.value) == "os.environ"
                and isinstance(node.ctx, ast.Load)
            ):
                problems += env_read_problem(path, node, node.slice)
    for recipe in (REPO / "recipes").rglob("*.yaml"):
        problems += [
            f"{recipe.name}: {key}" for key in yaml_keys(yaml.safe_load(recipe.read_text())) if SECRET_ARG.search(key)
        ]
    assert not problems, problems


def env_read_problem(path: Path, node: ast.AST, name: ast.AST | None) -> list[str]:
    """An environment read is fine for the documented variables or a variable a recipe setting `*_var` names."""
    if isinstance(name, ast.Constant) and name.value in ENV_VARS:
        return []
    if name is not None and ast.unparse(name).endswith("_var"):
        return []
    return [f"{path}:{node.lineno} reads environment variable {ast.unparse(name) if name is not None else '?'}"]


def yaml_keys(data) -> list[str]:
    if isinstance(data, dict):
        return [str(k) for k in data] + [k for v in data.values() for k in yaml_keys(v)]
    if isinstance(data, list):
        return [k for v in data for k in yaml_keys(v)]
    return []


def test_the_api_key_is_read_from_the_named_variable_and_sent_only_as_a_bearer_token(monkeypatch):
    monkeypatch.delenv("GRPOKIT_TEST_KEY", raising=False)
    with pytest.raises(ValueError, match=r"inference.init_args.api_key_var names \$GRPOKIT_TEST_KEY, which is not set"):
        RemoteEngine(api_key_var="GRPOKIT_TEST_KEY").setup("unused")
    monkeypatch.setenv("GRPOKIT_TEST_KEY", "sk-test-123")
    answer = {
        "choices": [{"index": 0, "token_ids": [5], "logprobs": {"token_logprobs": [-0.5]}, "finish_reason": "stop"}]
    }
    with ScriptedServer([answer]) as server:
        engine = RemoteEngine(base_url=server.url, api_key_var="GRPOKIT_TEST_KEY")
        engine.setup("unused")
        engine.generate([[1]], 1, SamplingSettings(max_tokens=2))
    assert server.request_headers[0]["Authorization"] == "Bearer sk-test-123"
    assert all(
        "sk-test-123" not in repr(v) for k, v in vars(engine).items() if k != "_headers"
    )  # kept only in the headers


def _post(url: str, headers: dict[str, str]) -> tuple[int, dict]:
    """POST a text/plain body (what a web page may send without a preflight) with `headers`."""
    import json
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        url + "/completions", data=b'{"prompt": "hi", "max_tokens": 1}', method="POST", headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_a_web_page_cannot_drive_the_local_server(tiny_model):
    """A page the user visits may POST text/plain to 127.0.0.1 (no CORS preflight), or reach it under its
    own name by rebinding DNS: a foreign Origin or Host is refused with 403; the orchestrator's and SDKs'
    requests (no Origin, a loopback Host) are answered."""
    from tests.support.servers import serving

    with serving(tiny_model) as (_, server):
        port = server.server_address[1]
        plain = {"Content-Type": "text/plain"}
        assert _post(server.url, plain)[0] == 200  # urllib sends Host: 127.0.0.1:port and no Origin
        assert _post(server.url, {**plain, "Host": f"localhost:{port}"})[0] == 200
        status, body = _post(server.url, {**plain, "Origin": "https://evil.example"})
        assert status == 403 and "cross-origin request from 'https://evil.example' refused" in body["error"]["message"]
        assert body["error"]["type"] == "PermissionDeniedError"
        status, body = _post(server.url, {**plain, "Host": f"rebind.evil.example:{port}"})
        assert status == 403 and "server.allowed_hosts" in body["error"]["message"]


@pytest.mark.unit
def test_the_browser_guard_allows_what_the_settings_name():
    from grpokit.inference.server.browsers import BrowserGuard, host_name
    from grpokit.inference.server.errors import RequestError

    assert [host_name(h) for h in ("127.0.0.1:8000", "[::1]:80", "LOCALHOST", "::1")] == [
        "127.0.0.1",
        "::1",
        "localhost",
        "::1",
    ]
    loopback = BrowserGuard.for_address("127.0.0.1", None, [])
    loopback.check({"host": "[::1]:8000"})
    with pytest.raises(RequestError, match="Host 'example.com' refused"):
        loopback.check({"host": "example.com"})
    BrowserGuard.for_address("127.0.0.1", ["gpu-box"], ["http://ui.local"]).check(
        {"host": "gpu-box:8000", "origin": "http://ui.local/"}
    )
    exposed = BrowserGuard.for_address("0.0.0.0", None, [])
    exposed.check({"host": "any.name:8000"})  # a server bound elsewhere is reached under any name
    with pytest.raises(RequestError, match="cross-origin request"):
        exposed.check({"host": "any.name", "origin": "null"})
    BrowserGuard.for_address("0.0.0.0", ["*"], ["*"]).check({"host": "x", "origin": "https://y"})
