"""Scripted participant behaviour for ``SagaEnvironment``: what a participant answers, attempt by attempt.

A participant in the environment keeps a record by idempotency key, as the kit does: once an outcome is
recorded (a success, or a definitive failure), every later attempt of that key is answered from the record; a
transient failure is not recorded, so a later attempt does the work. A compensation that arrives before its
forward step took effect leaves a tombstone: the forward, when it comes, is answered ``Compensated``.

Behaviours chain with ``then``: each covers the first attempts it describes (``fail_transiently(n)`` n of them,
``time_out`` and ``answer_late`` the first) and hands the later ones to ``then``, which counts them from its own
first. What an attempt records answers every attempt after it, whatever ``then`` says; so a chain that could
only start after a recorded attempt is refused where it is written (``time_out(effect=False, then=time_out())``
times out twice, ``time_out(then=time_out())`` could not).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import timedelta

from pydantic import BaseModel

__all__ = ["Behaviour", "Response", "answer_late", "fail", "fail_transiently", "succeed", "time_out"]


@dataclass(frozen=True)
class Response:
    """What one attempt does: its outcome (None: no answer now), when its answer arrives, whether it is
    recorded (the effect applied), and the output it gives."""

    status: str  # SUCCEEDED or FAILED
    error_type: str | None = None
    message: str | None = None
    retryable: bool = False
    output: BaseModel | bytes | None = None
    delay_ms: int = 0
    answered: bool = True  # False: the effect may be applied, but no answer comes (a timeout follows)

    @property
    def recorded(self) -> bool:
        return self.status == "SUCCEEDED" or not self.retryable


class Behaviour:
    """How a participant answers an action, attempt by attempt (``respond``)."""

    def respond(self, attempt: int) -> Response:
        raise NotImplementedError


@dataclass(frozen=True)
class _Succeed(Behaviour):
    output: BaseModel | bytes | None = None

    def respond(self, attempt: int) -> Response:
        return Response("SUCCEEDED", output=self.output)


@dataclass(frozen=True)
class _Fail(Behaviour):
    error_type: str
    message: str = ""
    retryable: bool = False

    def respond(self, attempt: int) -> Response:
        return Response("FAILED", self.error_type, self.message or f"scripted {self.error_type}", self.retryable)


@dataclass(frozen=True)
class _Transiently(Behaviour):
    times: int
    error_type: str
    then: Behaviour

    def respond(self, attempt: int) -> Response:
        if attempt <= self.times:
            return Response("FAILED", self.error_type, f"scripted {self.error_type} (attempt {attempt})", True)
        return self.then.respond(attempt - self.times)


@dataclass(frozen=True)
class _TimeOut(Behaviour):
    effect: bool
    then: Behaviour

    def __post_init__(self) -> None:
        if self.effect and isinstance(self.then, _TimeOut | _Late):
            raise ValueError("time_out(effect=True) records its first attempt's outcome, so the retry is answered "
                             "from the record at once and a timeout or late answer after it cannot happen: "
                             "time out first without the effect (time_out(effect=False, then=...))")

    def respond(self, attempt: int) -> Response:
        if not self.effect:  # the first attempt did nothing: ``then`` starts with the second
            if attempt == 1:
                return Response("FAILED", "NoAnswer", "no answer", True, answered=False)
            return self.then.respond(attempt - 1)
        # The first attempt is ``then``'s, its outcome recorded (when it records) and its answer lost, so the
        # retry (the same key) is answered from the record, as a kit participant would.
        response = self.then.respond(attempt)
        return replace(response, answered=False) if attempt == 1 else response


@dataclass(frozen=True)
class _Late(Behaviour):
    delay: timedelta
    then: Behaviour = field(default_factory=lambda: _Succeed())

    def __post_init__(self) -> None:
        if isinstance(self.then, _TimeOut | _Late):
            raise ValueError("answer_late answers its first attempt as `then` would, late, and records it, so `then` "
                             "cannot be a timeout or another late answer: chain them the other way round")

    def respond(self, attempt: int) -> Response:
        response = self.then.respond(attempt)
        return replace(response, delay_ms=round(self.delay.total_seconds() * 1000)) if attempt == 1 else response


def succeed(output: BaseModel | bytes | None = None) -> Behaviour:
    """Take effect and answer at once, with ``output`` (a step's output model, or raw bytes)."""
    return _Succeed(output)


def fail(error_type: str, message: str = "", *, retryable: bool = False) -> Behaviour:
    """Answer a failure: definitive (the default; recorded, nothing changed) or ``retryable`` every time."""
    return _Fail(error_type, message, retryable)


def fail_transiently(times: int, error_type: str = "Unavailable", then: Behaviour | None = None) -> Behaviour:
    """Fail retryably on the first ``times`` attempts, then behave as ``then`` (default: succeed), its first attempt
    being the one after them."""
    return _Transiently(times, error_type, then or succeed())


def time_out(*, effect: bool = True, then: Behaviour | None = None) -> Behaviour:
    """Give no answer to the first attempt (the step times out). With ``effect`` it took effect as ``then``'s first
    attempt (default: succeed) and the retry is answered from the record; without, it did nothing and the
    attempts after it behave as ``then``, from its first."""
    return _TimeOut(effect, then or succeed())


def answer_late(after: timedelta, then: Behaviour | None = None) -> Behaviour:
    """Answer the first attempt as ``then`` (default: succeed) would, ``after`` later (past the step's timeout,
    say); the later attempts as ``then`` does (a retry of a recorded outcome is answered from the record)."""
    return _Late(after, then or succeed())
