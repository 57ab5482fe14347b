"""Bulk operations without a database: a selection and the SQL condition it puts, the actions and their
commands, what a job may start with (its count first among it), and how big a batch is at a rate."""

from __future__ import annotations

import functools

import pytest

from saga_orchestrator.operations.bulk_jobs import (
    MAX_BATCH,
    BulkJobError,
    CountChanged,
    NotCounted,
    Selection,
    action_named,
    actions,
    batch_size,
    check_job,
    command_row,
    counted_problem,
    criteria,
    job_operator,
    start_counted,
)
from saga_orchestrator.orchestrator.domain.definition import DefinitionRegistry
from saga_orchestrator.orchestrator.outbound import PendingWrites
from saga_orchestrator.orchestrator.store.operations import bulk_jobs as store
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.participants.trip.scenarios import SCENARIOS
from saga_orchestrator.schemas import event_types as ev
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.ids import bulk_job_of, bulk_message_id
from saga_orchestrator.schemas.message_types import (
    CancelSaga,
    Lever,
    OperateSaga,
    ReleaseSaga,
    ResumeCompensation,
    control_command,
)
from saga_orchestrator.schemas.topics import Topics
from saga_orchestrator.testing import SagaEnvironment, fail_transiently
from saga_orchestrator.testing.history import SagaRun

REGISTRY = DefinitionRegistry([TRIP])
TOPICS = Topics()


def where(selection: Selection, registry: DefinitionRegistry, as_of: str = "now()", first: int = 1) -> store.Where:
    return store.where(criteria(selection, registry), as_of, first)


@pytest.mark.parametrize(("selection", "sql", "params"), [
    (Selection(saga_type="trip"), "started_at <= now() AND saga_type = $1", ["trip"]),
    (Selection(statuses=("running", "COMPENSATING", "RUNNING")),
     "started_at <= now() AND status = ANY($1::text[])", [["COMPENSATING", "RUNNING"]]),
    (Selection(older_than_s=7200), "started_at <= now() AND updated_at < now() - make_interval(secs => $1)",
     [7200]),
    (Selection(tenant="acme", error="timeout"), "started_at <= now() AND tenant_id = $1 AND last_error = $2",
     ["acme", "timeout"]),
    (Selection(participant="payment"),
     "started_at <= now() AND (saga_type, current_step) IN (SELECT * FROM unnest($1::text[], $2::text[]))",
     [["trip"], ["charge_card"]]),
])
def test_a_selection_is_one_parameterised_condition(selection: Selection, sql: str, params: list[object]) -> None:
    condition = where(selection, REGISTRY)
    assert (condition.sql, condition.params) == (sql, params)


def test_every_criterion_at_once_numbers_its_parameters_from_where_it_is_told() -> None:
    selection = Selection(saga_type="trip", statuses=("RUNNING",), older_than_s=60, tenant="t", error="Declined",
                          participant="hotel")
    condition = where(selection, REGISTRY, as_of="$1", first=2)
    assert condition.sql == (
        "started_at <= $1 AND saga_type = $2 AND status = ANY($3::text[]) AND updated_at < $1 - make_interval(secs"
        " => $4) AND tenant_id = $5 AND last_error = $6 AND (saga_type, current_step) IN (SELECT * FROM"
        " unnest($7::text[], $8::text[]))")
    assert condition.params == ["trip", ["RUNNING"], 60, "t", "Declined", ["trip"], ["book_hotel"]]


def test_a_value_never_enters_the_sql_text() -> None:
    condition = where(Selection(tenant="x'; DROP TABLE saga.events; --"), REGISTRY)
    assert "DROP" not in condition.sql and condition.params == ["x'; DROP TABLE saga.events; --"]


@pytest.mark.parametrize(("make", "problem"), [
    (lambda: Selection(), "a selection needs at least one of"),
    (lambda: Selection(statuses=("STUCK",)), "'STUCK' is not a saga state"),
    (lambda: Selection(older_than_s=0), "older than 0 s: an age must be positive"),
    (lambda: Selection(tenant=" "), "tenant must not be empty"),
    (lambda: where(Selection(saga_type="trap"), REGISTRY), "unknown saga type 'trap'; known types: trip"),
    (lambda: where(Selection(participant="bank"), REGISTRY),
     "no saga type has a step served by participant 'bank'; known participants: flight, hotel, notification, "
     "payment"),
])
def test_a_selection_that_cannot_be_says_what_to_change(make: object, problem: str) -> None:
    with pytest.raises(BulkJobError, match="^" + problem.replace("(", r"\(")):
        make()  # type: ignore[operator]


def test_a_selection_survives_its_json_and_says_itself_in_one_line() -> None:
    selection = Selection(saga_type="trip", statuses=("RUNNING", "FAILED"), older_than_s=90, error="timeout")
    assert Selection.from_json(selection.to_json()) == selection
    assert selection.to_json() == {"saga_type": "trip", "statuses": ["FAILED", "RUNNING"], "older_than_s": 90,
                                   "error": "timeout"}
    assert selection.describe() == "type trip, state FAILED or RUNNING, not updated for 90 s, error timeout"
    with pytest.raises(BulkJobError, match="not a selection"):
        Selection.from_json({"statuses": 5})


@pytest.mark.parametrize(("name", "action"), [
    ("retry-now", "RetryNow"), ("RetryNow", "RetryNow"), ("force-compensate", "ForceCompensate"),
    ("terminate", "Terminate"), ("cancel", "Cancel"), ("resume", "Resume"), ("release", "Release"),
    ("UNPAUSE", "Unpause"),
])
def test_an_action_is_named_as_the_command_line_or_the_lever_spells_it(name: str, action: str) -> None:
    assert action_named(name) == action


def test_every_lever_is_an_action_and_an_unknown_one_is_refused_with_the_list() -> None:
    assert set(actions()) == {lever.value for lever in Lever} - {"DlqReplay"} | {"Cancel", "Resume", "Release"}
    with pytest.raises(BulkJobError, match="unknown action 'explode'; use one of retry-now, skip, "):
        action_named("explode")


def test_each_action_becomes_its_control_command_naming_the_job() -> None:
    operator = job_operator("ana", 7)
    assert operator == "ana (bulk job 7)"

    def sent(action: str, step: str | None, reason: str) -> object:  # as the runner encodes, and the orchestrator reads
        return wire.decode_incoming("control", wire.encode_control(control_command(action, "s-1", step, operator,
                                                                                   reason)))

    assert sent("Terminate", None, "settled") == OperateSaga(saga_id="s-1", action="Terminate", step=None,
                                                             operator=operator, reason="settled")
    assert sent("RetryNow", "charge_card", "bank back") == OperateSaga(
        saga_id="s-1", action="RetryNow", step="charge_card", operator=operator, reason="bank back")
    assert sent("Pause", "charge_card", "look") == OperateSaga(saga_id="s-1", action="Pause", step=None,
                                                               operator=operator, reason="look")
    assert sent("Cancel", None, "dup") == CancelSaga(saga_id="s-1", reason="dup", operator=operator)
    assert sent("Resume", None, "fixed") == ResumeCompensation(saga_id="s-1", operator=operator, detail="fixed")
    assert sent("Release", None, "deployed") == ReleaseSaga(saga_id="s-1", operator=operator, detail="deployed")


def test_a_command_row_goes_to_saga_control_keyed_by_its_saga_with_an_id_of_its_job() -> None:
    row = command_row(Topics("p."), 7, "s-1", "trip", b"body")
    assert (row.topic, row.key, row.value, row.message_id) == ("p.saga.control", "s-1", b"body", "bulk:7:s-1")
    assert row.headers == {"message_id": "bulk:7:s-1", "causation_id": "bulk-job:7", "saga_id": "s-1",
                           "saga_type": "trip"}


@pytest.mark.parametrize(("action", "step", "operator", "reason", "rate", "problem"), [
    ("Explode", None, "ana", "why", 1, "unknown action 'Explode'"),
    ("RetryNow", None, "ana", "why", 1, "RetryNow acts on one step: name it"),
    ("Skip", " ", "ana", "why", 1, "Skip acts on one step"),
    ("Terminate", None, " ", "why", 1, "a bulk job needs an operator"),
    ("Terminate", None, "ana", "", 1, "a bulk job needs a reason"),
    ("Terminate", None, "ana", "x" * 4001, 1, "the operator and the reason are recorded in each saga"),
    ("Terminate", None, "ana", "why", 0, "rate 0/s: give a rate above 0"),
    ("Terminate", None, "ana", "why", 5000, "rate 5000/s"),
])
def test_a_job_that_cannot_start_says_why(action: str, step: str | None, operator: str, reason: str, rate: float,
                                          problem: str) -> None:
    with pytest.raises(BulkJobError, match="^" + problem):
        check_job(action, step, operator, reason, rate)


def test_a_job_that_can_start_passes() -> None:
    check_job("Skip", "send_itinerary", "ana", "sent by hand", 0.5)


@pytest.mark.parametrize(("rate", "size"), [(0.1, 1), (1, 1), (4, 1), (7.9, 1), (8, 2), (10, 2), (100, 25),
                                             (1000, MAX_BATCH)])
def test_a_batch_is_a_quarter_second_of_the_rate_and_at_least_one_saga(rate: float, size: int) -> None:
    assert batch_size(rate) == size


def test_a_jobs_command_that_its_saga_refuses_counts_against_the_job() -> None:
    run = SagaRun(TRIP, saga_id="t-bulk")
    run.start()
    writes = PendingWrites(TOPICS)
    for message_id, action, operator in ((bulk_message_id(7, "t-bulk"), Lever.UNPAUSE, "lou (bulk job 7)"),
                                         ("cli:1", Lever.UNPAUSE, "ana"),  # refused too, but no job's
                                         (bulk_message_id(8, "t-bulk"), Lever.PAUSE, "lou (bulk job 8)")):
        decision = run.send(OperateSaga(saga_id="t-bulk", action=action, step=None, operator=operator,
                                        reason="tidy up"))
        writes.record(decision, message_id)
    assert [type(event).__name__ for event in run.events[-3:]] == [
        "OperatorActionRefused", "OperatorActionRefused", "OperatorAction"]
    assert writes.bulk_refusals == {7: 1}


def test_a_bulk_jobs_message_id_names_its_job() -> None:
    assert bulk_job_of(bulk_message_id(12, "a:b")) == 12
    assert bulk_job_of("cli:1") is None and bulk_job_of("bulk:x:s") is None and bulk_job_of("bulk:3:") is None


async def test_the_test_kit_runs_a_bulk_job_on_the_memory_adapter_at_its_rate() -> None:
    env = SagaEnvironment(TRIP)
    env.script(("payment", "charge_card"), fail_transiently(1))
    paused = [await env.start("trip", SCENARIOS["happy"].trip(f"bulk-{i}"), saga_id=f"bulk-{i}") for i in range(3)]
    for saga_id in paused:
        await env.pause(saga_id)  # RUNNING, and nothing moves until a lever
    running = Selection(statuses=("RUNNING",))
    assert (await env.bulk_count(running)).sample == paused
    began = env.now
    job = await env.bulk_run(running, "Terminate", "settled at the desk", rate_per_s=2)
    assert (job.status, job.total, job.done, job.failed, job.last_saga_id) == ("DONE", 3, 3, 0, "bulk-2")
    assert env.now - began >= 1000  # one saga a batch at 2/s: each batch held the next back half a second
    for saga_id in paused:
        state = env.state(saga_id)
        assert state is not None and state.status.value == "TERMINATED"
        assert any(isinstance(event, ev.OperatorAction) and event.operator == f"test (bulk job {job.id})"
                   for event in env.history(saga_id))
    assert (await env.bulk_count(running)).total == 0
    with pytest.raises(BulkJobError, match="no saga matches"):
        await env.bulk_run(running, "Terminate", "again")


def test_a_bulk_start_needs_its_count_first_and_the_count_still_true() -> None:
    missing = counted_problem(None, 3)
    assert isinstance(missing, NotCounted) and "count the sagas first" in str(missing)
    assert "POST /api/v1/bulk/count" in str(missing) and "`expected`" in str(missing)
    stale = counted_problem(4, 3)
    assert isinstance(stale, CountChanged) and "matches 3 sagas now, not the 4 counted: count again" in str(stale)
    assert counted_problem(3, 3) is None and counted_problem(0, 0) is None


async def test_a_counted_start_is_refused_uncounted_or_stale_and_records_nothing_then() -> None:
    env = SagaEnvironment(TRIP)
    env.script(("payment", "charge_card"), fail_transiently(1))
    paused = [await env.start("trip", SCENARIOS["happy"].trip(f"counted-{i}"), saga_id=f"counted-{i}")
              for i in range(2)]
    for saga_id in paused:
        await env.pause(saga_id)
    running = Selection(statuses=("RUNNING",))
    job = functools.partial(start_counted, env.bulk_store, running, env.definitions, action="Terminate",
                            operator="lou", reason="settled at the desk")
    with pytest.raises(NotCounted):
        await job(expected=None)
    with pytest.raises(CountChanged, match="matches 2 sagas now, not the 3 counted"):
        await job(expected=3)
    assert await env.bulk_store.jobs(10) == []
    started = await job(expected=(await env.bulk_count(running)).total)
    assert (started.total, started.operator, started.status) == (2, "lou", "RUNNING")
