"""Fill .whl/ with the wheels grpokit's GPU checks import that the GPU image lacks (it has torch,
transformers, lightning, peft and their dependencies; it reaches no package index).

The list is not kept by hand: it is every distribution whose modules `grpokit fit` and the checks
import here (grpokit's CLI and components, the built-in environments with verifiers, the HTTP server),
less what the GPU image is known to ship. bench/gpu_session.sh installs, on the GPU machine, only the
wheels whose distribution is missing there, so a package the image has is never shadowed.

    python bench/gpu_wheels.py          # here, before `bash bench/gpu_session.sh` (carry .whl and .gpu)
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# What the GPU image ships (torch 2.11, transformers 5.17, lightning, peft and their dependencies).
IMAGE = {
    "torch", "transformers", "lightning", "pytorch-lightning", "lightning-utilities", "torchmetrics",
    "peft", "numpy", "sympy", "mpmath", "typing_extensions", "safetensors", "tokenizers",
    "huggingface-hub", "jinja2", "markupsafe", "filelock", "fsspec", "networkx", "pyyaml", "packaging",
    "regex", "requests", "tqdm", "psutil", "accelerate", "setuptools", "triton", "urllib3", "charset-normalizer",
    "grpokit",
}  # fmt: skip
# Imported here only because installed here: torch, torchmetrics and anyio try them and go on without.
OPTIONAL = {
    "matplotlib", "scipy", "dill", "pillow", "fonttools", "kiwisolver", "cycler", "pyparsing", "contourpy",
    "python-dateutil", "six", "trio", "outcome", "sortedcontainers", "colorama",
}  # fmt: skip
IMPORTS = ["grpokit.main", "grpokit.envs.reverse_text", "verifiers.v1", "grpokit.inference.server.http", "zmq"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64", "any"]


def needed() -> list[str]:
    """`name==version` of each distribution the checks import here, less the image's."""
    before = set(sys.modules)
    for name in IMPORTS:
        importlib.import_module(name)
    from grpokit.cli.discovery import discover

    discover()
    tops = {m.split(".")[0] for m in set(sys.modules) - before}
    by_module = md.packages_distributions()
    dists = {d for top in tops for d in by_module.get(top, [])}
    norm = {i.lower().replace("_", "-") for i in IMAGE | OPTIONAL}
    return sorted(f"{d}=={md.version(d)}" for d in dists if d.lower().replace("_", "-") not in norm)


def main() -> int:
    out = REPO / ".whl"
    out.mkdir(exist_ok=True)
    failed = []
    for req in needed():
        platform_args = [a for p in PLATFORMS for a in ("--platform", p)]
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
        cmd += ["--python-version", "3.12", "--implementation", "cp", *platform_args, "-d", str(out), req]
        if subprocess.run(cmd, capture_output=True, text=True).returncode:
            failed.append(req)
    size = sum(f.stat().st_size for f in out.glob("*.whl")) / 2**20
    print(f"{len(list(out.glob('*.whl')))} wheels, {size:.1f} MiB in {out}")
    if failed:
        print("could not fetch: " + " ".join(failed), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
