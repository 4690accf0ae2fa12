"""`python -m grpokit.bench generate|train ...` (the same as `grpokit bench ...`)."""

import sys

from grpokit.bench.command import main

sys.exit(main())
