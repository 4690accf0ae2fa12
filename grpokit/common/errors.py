"""Errors grpokit raises about the data a running job was handed, as opposed to its own faults."""

from __future__ import annotations


class RunDataError(ValueError):
    """Data handed to a running job cannot be trained on: an environment's reward that is not a
    moderate number or a reward function that raised, a batch file of another step or cut short. The
    message names the source (environment and example, or the file) and the fix, so the `grpokit`
    command prints it as one line and exits with 1 (grpokit.main.entry); nothing trains on the data."""
