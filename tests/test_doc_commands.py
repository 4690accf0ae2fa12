"""Every `grpokit fit|train|infer|orchestrate` command in README.md and docs/ parses as written.

A renamed key, a moved recipe or a misspelt component in a documented command is the first thing a
newcomer hits. Each command (continuation lines joined, trailing comment and output redirect dropped)
goes through the checks `grpokit` runs before building anything (recipe files, component names) and
through the recipe parser (`--print_config`, nothing is built or trained), from the clone's root, where
the docs say to run them. Commands with a placeholder (MODEL_DIR, r.yaml, /path/to, my_lab) are skipped.
"""

import re
import shlex
from pathlib import Path

import pytest

from grpokit.cli.component_args import check_component_names
from grpokit.cli.recipe_files import check_recipe_files, resolve_recipe_names
from grpokit.sweep.resolve import resolve_config

ROOT = Path(__file__).resolve().parents[1]
COMMAND = re.compile(r"^grpokit (fit|train|infer|orchestrate)\s+--")  # not a diagram's "grpokit train ──"
PLACEHOLDERS = (
    "MODEL_DIR",
    " r.yaml",  # a word of its own: recipes/calculator.yaml ends in r.yaml too
    "/path/to",
    "my_lab",
    "NAME",
    "...",
    "Reinforce",
)  # Reinforce: docs/custom-components.md's own package


def documented_commands() -> list[tuple[str, str]]:
    """(where, command) for each grpokit run command in a fenced code block of README.md or docs/*.md."""
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        in_block, pending, start = False, "", 0
        for lineno, line in enumerate(doc.read_text().splitlines(), start=1):
            if line.startswith("```"):
                in_block, pending = not in_block, ""
                continue
            if not in_block:
                continue
            text = line.strip()
            if pending:
                pending += " " + text
            elif COMMAND.match(text):
                pending, start = text, lineno
            else:
                continue
            if pending.endswith("\\"):
                pending = pending[:-1].rstrip()
                continue
            found.append((f"{doc.relative_to(ROOT)}:{start}", pending))
            pending = ""
    return found


def recipe_argv(command: str) -> list[str]:
    """The command's arguments after the subcommand, without a trailing comment or output redirect."""
    words = shlex.split(command, comments=True)
    if ">" in words:
        words = words[: words.index(">")]
    return [w for w in words[2:] if w != "--print_config"]


COMMANDS = [c for c in documented_commands() if not any(p in c[1] for p in PLACEHOLDERS)]


def test_the_docs_document_run_commands():
    assert len(COMMANDS) >= 20, COMMANDS  # the extraction found them (README quickstart, docs recipes)


@pytest.mark.parametrize("where,command", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_a_documented_command_parses(where, command, monkeypatch):
    monkeypatch.chdir(ROOT)
    argv = resolve_recipe_names(recipe_argv(command))  # `--config reverse_text`: as grpokit.main does
    check_recipe_files(["fit", *argv])
    check_component_names(["fit", *argv])
    resolved = resolve_config(argv, where)
    assert "\nmodel:" in resolved and "\ndata:" in resolved, resolved[:500]  # it printed the whole recipe
