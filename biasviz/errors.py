"""Errors a user can fix: the CLI prints them as one ``Error:`` line instead of a traceback."""

from __future__ import annotations


class BiasvizError(Exception):
    """A problem with the user's input or environment, with a message that says what to do.

    The CLI turns it into ``Error: <message>`` on stderr and exit code 1.
    """

    exit_code = 1


class UsageError(BiasvizError):
    """A bad combination of command-line options (exit code 2, like Click's own usage errors)."""

    exit_code = 2
