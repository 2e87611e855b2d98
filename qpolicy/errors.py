"""Exceptions of the qpolicy library.

Library code raises these; only the CLI turns them into exit codes and messages.
"""


class QPolicyError(Exception):
    """Base class of every error qpolicy reports to a user."""

    exit_code = 1


class ValidationError(QPolicyError):
    """A value given by the user is not acceptable; the message names it."""

    exit_code = 2


class PlanError(ValidationError):
    """A set of pods cannot be planned on a GPU (shares oversubscribed, share missing)."""


class StateError(QPolicyError):
    """The desired-state file cannot be read, parsed or written."""
