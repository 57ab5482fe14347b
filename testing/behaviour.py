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

As the kit does, a participant answers every command it picks up: a forward command picked up after its attempt
expired (its participant was stopped, ``SagaEnvironment.stop``) is answered ``Expired`` without running, and a
handler that overruns the step's timeout is answered ``HandlerTimedOut``. ``defer`` answers later, as a person
would, or never (the kit then answers ``AnswerTimedOut`` at the step's timeout).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import timedelta

from pydantic import BaseModel

__all__ = ["Behaviour", "Response", "answer_late", "defer", "fail", "fail_transiently", "succeed", "time_out"]


@dataclass(frozen=True)
class Response:
    """What one attempt does: its outcome, when its answer arrives, whether it is recorded (the effect applied),
    and the output it gives; or (``deferred``) that its answer comes later."""

    status: str  # SUCCEEDED or FAILED
    error_type: str | None = None
    message: str | None = None
    retryable: bool = False
    output: BaseModel | bytes | None = None
    delay_ms: int = 0
    after_timeout: bool = False  # the answer arrives just after the step's timeout (``delay_ms`` is added to it)
    overran: bool = False  # the handler ran past the step's timeout: answered HandlerTimedOut then, nothing kept
    deferred: bool = False  # the handler deferred its answer: ``answer`` comes ``answer_after_ms`` later (or never)
    answer: Response | None = None
    answer_after_ms: int | None = None

    @property
    def recorded(self) -> bool:
        return not self.overran and not self.deferred and (self.status == "SUCCEEDED" or not self.retryable)


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
        if not self.effect:  # the first attempt's handler overran: ``then`` starts with the second
            if attempt == 1:
                return Response("FAILED", "HandlerTimedOut", "the handler ran past the step's timeout", True,
                                overran=True)
            return self.then.respond(attempt - 1)
        # The first attempt is ``then``'s, its outcome recorded (when it records); its answer arrives only after
        # the step's timeout, and the saga takes it then.
        response = self.then.respond(attempt)
        return replace(response, after_timeout=True) if attempt == 1 else response


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
    """The first attempt outlasts the step's timeout. With ``effect`` it took effect as ``then``'s first attempt
    (default: succeed) and its answer comes just after the timeout (the saga waits for it); without, its handler
    overran and was cancelled (answered ``HandlerTimedOut``, nothing kept: a retry follows, as the step's policy
    says) and the attempts after it behave as ``then``, from its first."""
    return _TimeOut(effect, then or succeed())


@dataclass(frozen=True)
class _Defer(Behaviour):
    answer: Behaviour | None
    after: timedelta | None

    def respond(self, attempt: int) -> Response:
        answer = None if self.answer is None else self.answer.respond(1)
        after = None if self.after is None else round(self.after.total_seconds() * 1000)
        return Response("DEFERRED", deferred=True, answer=answer, answer_after_ms=after)


def defer(answer: Behaviour | None = None, *, after: timedelta | None = None) -> Behaviour:
    """The handler defers its answer (it asked a person): ``answer`` (default: succeed) is given ``after`` later, or
    never when ``after`` is None (the participant then answers ``AnswerTimedOut`` at the step's timeout). A
    withdrawal meanwhile (the saga turned back) ends the wait: the answer is refused."""
    return _Defer((answer or succeed()) if after is not None else None, after)


def answer_late(after: timedelta, then: Behaviour | None = None) -> Behaviour:
    """Answer the first attempt as ``then`` (default: succeed) would, ``after`` later (past the step's timeout,
    say); the later attempts as ``then`` does (a retry of a recorded outcome is answered from the record)."""
    return _Late(after, then or succeed())
