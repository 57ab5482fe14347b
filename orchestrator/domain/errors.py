"""Errors raised by the pure core.

Every error is loud on purpose: a definition that cannot run, a history that does not fit its definition or
a message that contradicts the saga it names must stop the message, never be guessed around. ``retriable``
follows aiokafka's convention: it tells the caller whether handling the same input again can succeed. None of
these can, so they are all ``False``.
"""

from __future__ import annotations

from typing import ClassVar


class DomainError(Exception):
    """Base of every error of the pure core."""

    retriable: ClassVar[bool] = False


class DefinitionError(DomainError):
    """A saga definition is invalid (unknown dependency, cycle, duplicate step, bad pivot, ...)."""


class UnknownDefinition(DomainError, LookupError):
    """No definition is registered for a saga type (and version)."""


class ShapeChanged(UnknownDefinition):
    """The saga started on a shape of its definition (its recorded fingerprint), or took a patch onto one, that the
    registered definition of its type and version does not have: deciding it by this one would silently change
    its path. ``fingerprint``: that shape, which another instance of a rolling deploy may serve."""

    def __init__(self, message: str, fingerprint: str) -> None:
        super().__init__(message)
        self.fingerprint = fingerprint


class HistoryMismatch(DomainError):
    """A saga's recorded events do not fit its definition (unknown step, gap in seq, wrong version...)."""


class IllegalTransition(HistoryMismatch):
    """An event would move a saga or a step between two states the transition tables do not allow."""



class InvalidMessage(DomainError):
    """A message names a step the definition does not have, or carries a foreign idempotency key."""


class StartRefused(DomainError):
    """A StartSaga names a saga type, or a version of it, that takes no new starts here: not registered, or
    draining."""
