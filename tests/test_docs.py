"""Generated docs are current."""

from pathlib import Path

from grpokit.cli.discovery import components, discover
from grpokit.cli.registry_cmd import components_markdown

ROOT = Path(__file__).resolve().parents[1]


def test_components_md_is_current():
    discover()
    builtin = [c for c in components() if c.class_path.startswith("grpokit.")]
    expected = components_markdown(builtin)
    assert (ROOT / "docs" / "components.md").read_text() == expected, (
        "regenerate: grpokit registry list --builtin --markdown > docs/components.md"
    )
