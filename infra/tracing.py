"""OpenTelemetry spans of a saga's work, each in the saga's own trace: the one its ``traceparent`` names.

Every message of a saga carries the W3C ``traceparent`` recorded from its start (``schemas.headers``), so a span
parented on a message's header joins the saga's trace wherever it is made: the orchestrator's decisions
(``saga.decide``), the relays' publishes (``outbox.publish``) and the participants' handlers
(``participant.handle``). A command carries the span of the decision that sent it instead, so its publish and
handler nest under that decision. A saga started without a trace context gets one from the span of its first
decision, which its SagaStarted records (only while spans are exported).

The isolation ladder opens the spans: every unit of work it runs (a batch, a group, one item, tried again) is a
``UnitSpans`` whose spans start with the unit and end with it, its failure recorded on each; the service only
names the trace each belongs to (``open_span``, ``unit_span``) and describes the work on it.

A process exports its spans over OTLP/HTTP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set, configured by the standard OpenTelemetry variables
(``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER`` and its argument,
``OTEL_EXPORTER_OTLP_HEADERS``...; ``OTEL_SDK_DISABLED=true`` turns it off). Without one nothing is exported
and a span costs next to nothing: no unit opens spans, ``open_span`` and ``unit_span`` hand out the shared
non-recording span, whose ``is_recording()`` is false, so call sites build no attributes; no header is parsed
and no SDK is imported. Log records made
inside a span carry the saga's ``trace_id`` either way (``infra.logging.saga_trace``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import (
    INVALID_SPAN,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    Tracer,
    set_span_in_context,
)
from opentelemetry.util.types import Attributes

from ..schemas.headers import valid_traceparent
from .logging import saga_trace, saga_trace_var
from .misconfigured import Misconfigured

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

INSTRUMENTATION = "saga_orchestrator"
ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
"""Either turns the export on (the first wins, as the exporter reads them)."""
SAMPLERS = frozenset({"always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off",
                      "parentbased_traceidratio"})
"""The values of ``OTEL_TRACES_SAMPLER`` the SDK knows without a plugin."""

tracer: Tracer | None = None
"""The tracer spans are made with; None: spans are off, and every helper here is a no-op. A hot path reads it
before it calls anything here, so that with spans off it does no work of theirs at all."""


def configure_tracing(service_name: str, environ: Mapping[str, str] = os.environ) -> TracerProvider | None:
    """Once per process, at start: when an OTLP endpoint is set (``ENDPOINTS``), a TracerProvider of the
    standard OpenTelemetry settings in ``environ`` (``OTEL_SERVICE_NAME`` wins over ``service_name``), its spans
    batched (``BatchSpanProcessor``: the export never blocks a saga) to the OTLP/HTTP exporter, made the global
    provider and the one ``span`` uses. None, and nothing installed, without an endpoint.

    Raises ``Misconfigured`` naming the variable when the endpoint is no http(s) URL or the sampler is unknown
    (the SDK would only log a warning and trace otherwise than asked)."""
    endpoint = next((environ[name] for name in ENDPOINTS if environ.get(name)), None)
    if endpoint is None or environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    _check(environ)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({SERVICE_NAME: environ.get("OTEL_SERVICE_NAME") or service_name})
    provider = TracerProvider(resource=resource)  # its sampler: OTEL_TRACES_SAMPLER (checked above)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    install(provider)
    return provider


def _check(environ: Mapping[str, str]) -> None:
    for name in ENDPOINTS:
        url = environ.get(name)
        if url and (urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc):
            raise Misconfigured(f"{name}={url!r} is no http(s) URL: the OTLP/HTTP exporter sends its spans there")
    sampler = environ.get("OTEL_TRACES_SAMPLER", "").strip().lower()
    if sampler and sampler not in SAMPLERS:
        raise Misconfigured(f"OTEL_TRACES_SAMPLER={sampler!r} is unknown: one of {', '.join(sorted(SAMPLERS))}")
    ratio = environ.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
    if sampler.endswith("traceidratio") and ratio:
        try:
            valid = 0.0 <= float(ratio) <= 1.0
        except ValueError:
            valid = False
        if not valid:
            raise Misconfigured(f"OTEL_TRACES_SAMPLER_ARG={ratio!r} is no ratio between 0 and 1")


def install(provider: trace.TracerProvider | None) -> None:
    """Make spans from now on with ``provider`` (None: make none). ``configure_tracing`` calls it; a test gives
    a provider of its own (an in-memory exporter) and None afterwards."""
    global tracer
    tracer = None if provider is None else provider.get_tracer(INSTRUMENTATION)


def enabled() -> bool:
    """Whether spans are made: a hot path asks before it gathers what only a span needs."""
    return tracer is not None


class UnitSpans(AbstractContextManager["UnitSpans"]):
    """The spans of one unit of work of an isolation ladder (``infra.isolation``), which opens it around the unit:
    spans ``name`` of ``kind``, one per ``open`` (the service names the saga trace it works for), each dated
    from the unit's start and all ended when the unit ends, its failure (if any) recorded on each. A unit tried
    again (a conflict, the next rung) gets spans of its own: a failed try stays visible in the saga's trace."""

    __slots__ = ("_kind", "_made_by", "_name", "_open", "_started_ns", "_token")

    def __init__(self, made_by: Tracer, name: str, kind: SpanKind) -> None:
        self._made_by, self._name, self._kind = made_by, name, kind
        self._open: list[Span] = []

    def open(self, traceparent: str | None, attributes: Attributes = None) -> Span:
        """A span of this unit, child of ``traceparent`` (a root span without one)."""
        made = self._made_by.start_span(self._name, context=parent_context(traceparent), kind=self._kind,
                                        attributes=attributes, start_time=self._started_ns)
        self._open.append(made)
        return made

    def __enter__(self) -> UnitSpans:
        self._started_ns = time.time_ns()
        self._open.clear()
        self._token = _unit_var.set(self)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, _tb: object) -> None:
        _unit_var.reset(self._token)
        for made in self._open:
            if error is not None:
                made.record_exception(error)
                made.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
            made.end()


_unit_var: ContextVar[UnitSpans | None] = ContextVar("saga_unit_spans", default=None)


def unit(name: str, kind: SpanKind = SpanKind.INTERNAL) -> UnitSpans | None:
    """The spans of a unit of work about to run (enter it around the unit), None while spans are off."""
    made_by = tracer
    return None if made_by is None else UnitSpans(made_by, name, kind)


def open_span(traceparent: str | None, attributes: Attributes = None) -> Span:
    """A span of the unit of work running in this task (``UnitSpans.open``): the unit ends it. The shared
    non-recording span while spans are off, or outside a unit."""
    current = _unit_var.get()
    return INVALID_SPAN if current is None else current.open(traceparent, attributes)


def unit_span(traceparent: str | None) -> AbstractContextManager[Span]:
    """``open_span``, current inside the block: log records made inside carry its trace id, spans made inside are
    its children; leaving the block does not end it, the unit does. Spans off (or outside a unit): only the log
    scope, with ``traceparent``'s trace id."""
    current = _unit_var.get()
    if current is None:
        return _Untraced(traceparent)
    return _current(current.open(traceparent), traceparent)


class _Untraced(AbstractContextManager[Span]):
    """``unit_span`` while spans are off: only the log scope (a class, not a generator: this runs per message)."""

    __slots__ = ("_token", "_traceparent")

    def __init__(self, traceparent: str | None) -> None:
        self._traceparent = traceparent

    def __enter__(self) -> Span:
        self._token = saga_trace_var.set(self._traceparent)
        return INVALID_SPAN

    def __exit__(self, *exc: object) -> None:
        saga_trace_var.reset(self._token)


@contextmanager
def _current(made: Span, traceparent: str | None) -> Iterator[Span]:
    with trace.use_span(made, end_on_exit=False, record_exception=False, set_status_on_exception=False):
        with saga_trace(traceparent or traceparent_of(made)):
            yield made


def parent_context(traceparent: str | None) -> Context | None:
    """The context whose current span is the remote one ``traceparent`` names (None: no parent; an invalid value
    counts as none)."""
    traceparent = valid_traceparent(traceparent)
    if traceparent is None:
        return None
    remote = SpanContext(trace_id=int(traceparent[3:35], 16), span_id=int(traceparent[36:52], 16), is_remote=True,
                         trace_flags=TraceFlags(int(traceparent[53:55], 16)))
    return set_span_in_context(NonRecordingSpan(remote))


def traceparent_of(made: Span) -> str | None:
    """The W3C ``traceparent`` that makes ``made`` the parent, None for an invalid (non-recording) span."""
    context = made.get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
