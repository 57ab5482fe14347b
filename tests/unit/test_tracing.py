"""Spans in the saga's trace (``infra.tracing``): a span is the child of the traceparent it is given, a saga
started without one gets the trace of its first decision, log records inside carry the trace id, and nothing is
made (nor the export configured) unless asked."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from saga_orchestrator.infra import tracing
from saga_orchestrator.infra.logging import saga_trace
from saga_orchestrator.infra.misconfigured import Misconfigured
from saga_orchestrator.orchestrator.inbound import CLIENT_IDS, Envelope
from saga_orchestrator.orchestrator.service import SagaService
from saga_orchestrator.orchestrator.store.memory import MemoryStore
from saga_orchestrator.participants.trip.definition import trip_definitions
from saga_orchestrator.participants.trip.scenarios import SCENARIOS
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.event_types import SagaStarted
from saga_orchestrator.schemas.headers import TRACEPARENT
from saga_orchestrator.schemas.topics import Topics
from tests.spans import spans_in_memory

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT_VALUE = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    with spans_in_memory() as exporter:
        yield exporter


def trace_hex(span: ReadableSpan) -> str:
    assert span.context is not None
    return f"{span.context.trace_id:032x}"


def in_unit(name: str) -> tracing.UnitSpans:
    """The spans of a unit of work, as an isolation ladder opens them around one."""
    spans = tracing.unit(name)
    assert spans is not None
    return spans


def test_a_span_is_the_child_of_the_traceparent_it_is_given_and_ends_with_its_unit(
        exported: InMemorySpanExporter, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO), in_unit("participant.handle"):
        with tracing.unit_span(TRACEPARENT_VALUE) as span:
            assert span.is_recording()
            logging.getLogger("t").info("inside")
        assert exported.get_finished_spans() == ()  # leaving the block did not end it: the unit does
    [made] = exported.get_finished_spans()
    assert made.name == "participant.handle" and trace_hex(made) == TRACE_ID
    assert made.parent is not None and f"{made.parent.span_id:016x}" == CLIENT_SPAN and made.parent.is_remote
    child = tracing.traceparent_of(span)
    assert child is not None and child.startswith(f"00-{TRACE_ID}-") and CLIENT_SPAN not in child
    assert [getattr(record, "trace_id", None) for record in caplog.records] == [TRACE_ID]


def test_without_a_traceparent_the_span_begins_a_trace_the_log_lines_name(exported: InMemorySpanExporter,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO), in_unit("saga.decide"):
        with tracing.unit_span(None):
            logging.getLogger("t").info("inside")
        logging.getLogger("t").info("after")
    [made] = exported.get_finished_spans()
    assert made.parent is None
    assert [getattr(record, "trace_id", None) for record in caplog.records] == [trace_hex(made), None]


def test_spans_off_make_nothing_yet_the_log_lines_carry_the_trace_id(caplog: pytest.LogCaptureFixture) -> None:
    assert not tracing.enabled() and tracing.unit("saga.decide") is None
    with caplog.at_level(logging.INFO), tracing.unit_span(TRACEPARENT_VALUE) as span:
        assert not span.is_recording() and tracing.traceparent_of(span) is None
        logging.getLogger("t").info("inside")
        with saga_trace(None):  # a scope of no saga inside one: no trace id
            logging.getLogger("t").info("nested")
    assert not tracing.open_span(TRACEPARENT_VALUE, {}).is_recording()  # nothing to make, nothing raised
    assert [getattr(record, "trace_id", None) for record in caplog.records] == [TRACE_ID, None]


def test_outside_a_unit_of_work_no_span_is_made(exported: InMemorySpanExporter) -> None:
    assert not tracing.open_span(TRACEPARENT_VALUE).is_recording()
    with tracing.unit_span(TRACEPARENT_VALUE) as span:
        assert not span.is_recording()
    assert exported.get_finished_spans() == ()


def test_a_unit_makes_one_span_per_saga_each_from_its_start_and_a_failed_one_marks_them_all(
        exported: InMemorySpanExporter) -> None:
    other = f"00-{'a' * 32}-{'b' * 16}-01"
    with pytest.raises(RuntimeError), in_unit("outbox.publish"):
        for traceparent, saga_id in ((TRACEPARENT_VALUE, "s-1"), (other, "s-2"), (None, "s-3")):
            tracing.open_span(traceparent, {"saga.id": saga_id})
        raise RuntimeError("refused")
    spans = sorted(exported.get_finished_spans(), key=lambda s: str(s.attributes["saga.id"] if s.attributes else ""))
    assert [(s.attributes or {}).get("saga.id") for s in spans] == ["s-1", "s-2", "s-3"]
    assert [trace_hex(s) for s in spans[:2]] == [TRACE_ID, "a" * 32] and spans[2].parent is None
    assert len({s.start_time for s in spans}) == 1  # each dated from the start of the unit
    assert {s.status.status_code for s in spans} == {StatusCode.ERROR}
    assert {s.status.description for s in spans} == {"RuntimeError: refused"}


def test_an_invalid_traceparent_counts_as_none() -> None:
    assert tracing.parent_context("00-not-a-trace-01") is None
    assert tracing.parent_context(f"00-{'0' * 32}-{CLIENT_SPAN}-01") is None
    assert tracing.parent_context(TRACEPARENT_VALUE) is not None


async def test_a_saga_started_without_a_trace_records_the_trace_of_its_first_decision(
        exported: InMemorySpanExporter) -> None:
    store = MemoryStore(clock_ms=lambda: 0)
    service = SagaService(store, trip_definitions(), Topics("t."), lambda: 0)
    await service.handle(Envelope(SCENARIOS["happy"].start("s-1"), "m-1", inbox_key=(CLIENT_IDS, "m-1")))
    [decided] = exported.get_finished_spans()
    assert decided.name == "saga.decide" and decided.parent is None
    assert (decided.attributes or {})["saga.message"] == "StartSaga"
    assert (decided.attributes or {})["saga.events"] == ("SagaStarted", "StepCommandSent", "StepCommandSent")
    rows = store.drain_outbox()
    assert {row.headers[TRACEPARENT][3:35] for row in rows} == {trace_hex(decided)}  # every command and event
    started = wire.decode_event(next(row.value for row in rows if row.topic == "t.saga.events"))
    assert isinstance(started, SagaStarted)
    assert decided.context is not None
    assert started.traceparent == (f"00-{trace_hex(decided)}-{decided.context.span_id:016x}"
                                   f"-{int(decided.context.trace_flags):02x}")


def test_no_endpoint_no_export_and_a_wrong_setting_is_refused_by_name() -> None:
    assert tracing.configure_tracing("saga-test", {}) is None
    assert tracing.configure_tracing("saga-test", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
                                                   "OTEL_SDK_DISABLED": "true"}) is None
    assert not tracing.enabled()
    with pytest.raises(Misconfigured, match=r"^OTEL_EXPORTER_OTLP_ENDPOINT="):
        tracing.configure_tracing("saga-test", {"OTEL_EXPORTER_OTLP_ENDPOINT": "127.0.0.1:4318"})
    with pytest.raises(Misconfigured, match=r"^OTEL_TRACES_SAMPLER="):
        tracing.configure_tracing("saga-test", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
                                                "OTEL_TRACES_SAMPLER": "sometimes"})
    with pytest.raises(Misconfigured, match=r"^OTEL_TRACES_SAMPLER_ARG="):
        tracing.configure_tracing("saga-test", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
                                                "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"})
    assert not tracing.enabled()
