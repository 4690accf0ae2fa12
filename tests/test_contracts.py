"""grpokit.testing's contract checks over every registered loss, advantage and filter (plugins too)."""

import importlib

import pytest

from grpokit.cli.discovery import components, discover

discover()
# test modules' own components are left to their tests: test_component_checks.py breaks contracts on purpose
CHECKED = [
    c
    for c in components()
    if c.kind in ("loss", "advantage", "filter", "noise") and not c.class_path.rpartition(".")[0].startswith("test")
]


def load(class_path: str) -> type:
    module, name = class_path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("component", CHECKED, ids=lambda c: f"{c.kind}-{c.name}")
def test_component_meets_its_contract(component):
    from grpokit.testing import check_component

    check_component(load(component.class_path))


def test_every_kind_has_a_builtin():
    kinds = {c.kind for c in components()}
    assert {"loss", "advantage", "filter", "noise", "transport", "broadcast", "inference"} <= kinds
