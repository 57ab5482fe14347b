"""Structured logging for every service: one JSON object (or one key=value line) per record.

Call sites use the stdlib logger and pass fields through ``extra``::

    log.info("batch published", extra={"table": "saga.outbox", "rows": 500})

so a record is greppable by field without a logging framework. A record made inside ``saga_trace`` (the spans of
``infra.tracing`` open one) carries the saga's ``trace_id`` too, whichever handler formats it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Literal

import orjson

# Attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD_ATTRS = frozenset(
    vars(logging.LogRecord("", logging.INFO, "", 0, "", None, None)).keys()
    | {"message", "asctime", "taskName"}
)


saga_trace_var: ContextVar[str | None] = ContextVar("saga_traceparent", default=None)
"""The ``traceparent`` of the saga this task works for, set by ``saga_trace`` (and ``infra.tracing.unit_span``)."""


@contextmanager
def saga_trace(traceparent: str | None) -> Iterator[None]:
    """Log records made inside the block (in this task or thread) carry ``trace_id``: the trace id of
    ``traceparent``, a W3C trace context (None: none, also for a block inside one that has one)."""
    token = saga_trace_var.set(traceparent)
    try:
        yield
    finally:
        saga_trace_var.reset(token)


def _stamp_trace_id(factory: Any) -> Any:
    """A LogRecord factory that adds the ``trace_id`` of the enclosing ``saga_trace`` to each record as it is
    made, so a handler that formats it later (elsewhere, after the block) still has it."""

    def make(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record: logging.LogRecord = factory(*args, **kwargs)
        traceparent = saga_trace_var.get()
        if traceparent is not None:
            record.trace_id = traceparent[3:35]  # version "00-", then the 32 hex digits of the trace id
        return record

    make.stamps_trace_id = True  # type: ignore[attr-defined]
    return make


if not getattr(logging.getLogRecordFactory(), "stamps_trace_id", False):
    logging.setLogRecordFactory(_stamp_trace_id(logging.getLogRecordFactory()))


def _extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    return {key: value for key, value in vars(record).items() if key not in _STANDARD_ATTRS}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, then the ``extra`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        line.update(_extra_fields(record))
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        # default=str keeps logging alive when a field is not JSON-native (a Path, an exception...).
        return orjson.dumps(line, default=str).decode()


class KeyValueFormatter(logging.Formatter):
    """``ts level logger msg key=value ...``, values quoted when they contain spaces."""

    def format(self, record: logging.LogRecord) -> str:
        parts = [
            self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            record.levelname.lower(),
            record.name,
            _quote(record.getMessage()),
        ]
        parts += [f"{key}={_quote(str(value))}" for key, value in _extra_fields(record).items()]
        text = " ".join(parts)
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def _quote(text: str) -> str:
    if not text or any(ch in text for ch in ' ="'):
        return '"' + text.replace('"', '\\"') + '"'
    return text


class RetriedByTheClient(logging.Filter):
    """Lets through only what the Kafka client does not retry by itself.

    aiokafka logs an error it retries anyway at ERROR or WARNING ("Failed fetch offsets from 1: [Error 6]
    NotLeaderForPartitionError" while a new topic elects its leaders, "Got error produce response ...
    retrying"): an expected transient, not news for an operator. A record whose arguments hold a retriable
    Kafka error is let through only when its logger is enabled for DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if not any(getattr(arg, "retriable", False) and isinstance(arg, Exception) for arg in args):
            return True
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def configure_logging(level: str | int = "INFO", fmt: Literal["json", "kv"] = "json") -> None:
    """Send every log record to stderr as JSON lines (``fmt="json"``) or key=value lines (``"kv"``), the
    libraries' too (the Kafka client's at WARNING at least, and none of the errors it retries by itself).

    Replaces the root logger's handlers, so calling it twice does not duplicate lines.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else KeyValueFormatter())
    handler.addFilter(RetriedByTheClient())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper() if isinstance(level, str) else level)
    # aiokafka logs every reconnect attempt at ERROR/WARNING; our own loops log the retry once with context.
    logging.getLogger("aiokafka").setLevel(max(root.level, logging.WARNING))
