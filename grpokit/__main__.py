"""`python -m grpokit COMMAND ...`: the same as the `grpokit` command (grpokit.main)."""

import sys

from grpokit.main import entry

sys.exit(entry())
