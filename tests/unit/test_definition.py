"""Saga definitions: validation at construction, retry policy arithmetic, the registry, the trip saga."""

from __future__ import annotations

import re

import pytest

from saga_orchestrator.orchestrator.domain.definition import (
    Condition,
    DefinitionRegistry,
    FailureMode,
    RetryPolicy,
    SagaDefinition,
    Step,
)
from saga_orchestrator.orchestrator.domain.errors import DefinitionError, UnknownDefinition
from saga_orchestrator.participants.trip.definition import TRIP, trip_definitions
from saga_orchestrator.schemas.event_types import SagaRejected, SagaStarted

UNLIMITED = RetryPolicy(max_attempts=None)


def step(name: str, *deps: str, **kw: object) -> Step:
    return Step(name=name, participant="p", command=f"do_{name}", depends_on=deps, **kw)  # type: ignore[arg-type]


def saga(*steps: Step, **kw: object) -> SagaDefinition:
    return SagaDefinition(saga_type="t", version=1, steps=steps, input_schema="saga.v1.T", **kw)  # type: ignore[arg-type]


INVALID = [
    ("duplicate", lambda: saga(step("a"), step("a")), "duplicate step name 'a'"),
    ("unknown dep", lambda: saga(step("a", "zz")), "step 'a' depends on unknown step 'zz'"),
    ("self cycle", lambda: saga(step("a", "a")), "dependency cycle a -> a"),
    (
        "cycle",
        lambda: saga(step("r"), step("a", "c"), step("b", "a"), step("c", "b")),
        "dependency cycle a -> c -> b -> a",
    ),
    ("no steps", lambda: saga(), "at least one step"),
    (
        "two pivots",
        lambda: saga(step("a", pivot=True), step("b", "a", pivot=True, retry=UNLIMITED)),
        "at most one pivot step, got a, b",
    ),
    (
        "unordered with pivot",
        lambda: saga(step("a"), step("p", "a", pivot=True), step("x")),
        "step 'x' is neither before nor after pivot 'p'",
    ),
    (
        "limited retry after pivot",
        lambda: saga(step("p", pivot=True), step("after", "p")),
        "step 'after' runs after pivot 'p' and must retry without limit",
    ),
    (
        "pivot not on success",
        lambda: saga(step("a"), step("p", "a", pivot=True, run_if=Condition.ALWAYS)),
        "pivot step 'p' must run ON_SUCCESS",
    ),
    (
        "on_failure in fail-fast",
        lambda: saga(step("a"), step("h", "a", run_if=Condition.ON_FAILURE)),
        "runs ON_FAILURE, which needs failure_mode CONTINUE",
    ),
    (
        "on_failure root",
        lambda: saga(step("h", run_if=Condition.ON_FAILURE), failure_mode=FailureMode.CONTINUE),
        "must depend on the steps whose failure it handles",
    ),
    (
        "compensate_on_continue without continue",
        lambda: saga(step("a"), compensate_on_continue=True),
        "compensate_on_continue needs failure_mode CONTINUE",
    ),
    ("colon in name", lambda: saga(step("a:compensate")), "free of ':'"),
    ("zero timeout", lambda: saga(step("a", timeout_ms=0)), "timeouts must be positive"),
    (
        "bad version",
        lambda: SagaDefinition(saga_type="t", version=0, steps=(step("a"),), input_schema="x"),
        "version must be >= 1",
    ),
    ("zero attempts", lambda: RetryPolicy(max_attempts=0), "max_attempts must be >= 1"),
    (
        "max below initial",
        lambda: RetryPolicy(initial_backoff_ms=500, max_backoff_ms=100),
        "initial_backoff_ms",
    ),
    ("shrinking backoff", lambda: RetryPolicy(multiplier=0.5), "multiplier must be >= 1"),
    ("jitter above one", lambda: RetryPolicy(jitter=1.5), "jitter must be within"),
]


@pytest.mark.parametrize(("build", "message"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_definitions_are_refused_with_a_clear_message(build: object, message: str) -> None:
    with pytest.raises(DefinitionError, match=re.escape(message)):
        build()  # type: ignore[operator]


def test_topological_order_is_stable_and_closures_are_transitive() -> None:
    d = saga(step("c", "b"), step("a"), step("b", "a"), step("x"))
    assert d.order == ("a", "x", "b", "c")
    assert d.upstream("c") == {"a", "b"}
    assert d.downstream("a") == {"b", "c"}
    assert d.downstream("x") == frozenset()


def test_trip_definition() -> None:
    assert TRIP.order == ("book_flight", "book_hotel", "charge_card", "send_itinerary")
    assert TRIP.pivot is not None and TRIP.pivot.name == "charge_card"
    assert TRIP.input_schema == "saga.v1.trip.TripRequest"
    charge = TRIP.step("charge_card")
    assert charge.retry.max_attempts == 5 and "CardDeclined" in charge.retry.non_retryable_errors
    assert TRIP.step("send_itinerary").compensation is None
    assert TRIP.step("send_itinerary").retry.max_attempts is None
    assert "CancellationRefused" in TRIP.step("book_flight").compensation_retry.non_retryable_errors
    assert TRIP.step("book_hotel").compensation_retry.max_attempts is None
    assert {s.participant for s in TRIP.steps} == {"flight", "hotel", "payment", "notification"}


@pytest.mark.parametrize(
    ("attempt", "expected"), [(1, 100), (2, 200), (3, 400), (4, 800), (5, 1000), (60, 1000), (5000, 1000)]
)
def test_backoff_grows_exponentially_up_to_the_cap(attempt: int, expected: int) -> None:
    policy = RetryPolicy(initial_backoff_ms=100, multiplier=2.0, max_backoff_ms=1000, jitter=0)
    assert policy.backoff_ms(attempt, "seed") == expected


def test_backoff_jitter_is_deterministic_and_bounded() -> None:
    policy = RetryPolicy(initial_backoff_ms=1000, multiplier=1.0, max_backoff_ms=10_000, jitter=0.2)
    delays = [policy.backoff_ms(1, f"s{i}:step:1") for i in range(200)]
    assert delays == [policy.backoff_ms(1, f"s{i}:step:1") for i in range(200)]
    assert all(800 <= d <= 1200 for d in delays)
    assert len(set(delays)) > 50  # actually spread


@pytest.mark.parametrize(
    ("failed_attempt", "retryable", "error", "expected"),
    [
        (1, True, "Busy", True),
        (2, True, "Busy", True),
        (3, True, "Busy", False),  # max_attempts reached
        (1, False, "Busy", False),  # participant says it will not get better
        (1, True, "CardDeclined", False),  # business error: never retried
    ],
)
def test_should_retry(failed_attempt: int, retryable: bool, error: str, expected: bool) -> None:
    policy = RetryPolicy(max_attempts=3, non_retryable_errors=frozenset({"CardDeclined"}))
    assert policy.should_retry(failed_attempt, retryable, error) is expected


def test_unlimited_policy_always_allows_another_attempt() -> None:
    assert UNLIMITED.allows_attempt(10**9)


def test_registry_versions_latest_and_lookup() -> None:
    v1 = saga(step("a"))
    v2 = SagaDefinition(saga_type="t", version=2, steps=(step("a"), step("b", "a")), input_schema="x")
    registry = DefinitionRegistry([v2, v1])
    registry.register(v1)  # the same definition again is fine
    assert registry.latest("t") is v2
    assert registry.get("t", 1) is v1
    assert registry.latest("nope") is None
    assert registry.types() == ("t",)
    assert registry.versions("t") == (1, 2)
    with pytest.raises(
        UnknownDefinition, match=r"no definition for saga type 't' version 3 \(registered: t v1, t v2\)"
    ):
        registry.get("t", 3)
    with pytest.raises(DefinitionError, match="already registered"):
        registry.register(SagaDefinition(saga_type="t", version=1, steps=(step("z"),), input_schema="x"))


def test_registry_finds_the_definition_of_a_history() -> None:
    registry = trip_definitions()
    started = SagaStarted(
        saga_id="s", seq=1, definition_version=1, occurred_at=0, saga_type="trip", tenant_id=None, input=b""
    )
    rejected = SagaRejected(
        saga_id="s", seq=1, definition_version=0, occurred_at=0, saga_type="x", reason="r"
    )
    assert registry.for_history([started]) is TRIP
    assert registry.for_history([rejected]) is None
    assert registry.for_history([]) is None
    assert registry.types() == ("trip",)
