"""Structured log lines: extra fields become JSON keys or key=value pairs."""

from __future__ import annotations

import logging

import orjson
import pytest

from saga_orchestrator.infra.logging import JsonFormatter, KeyValueFormatter, configure_logging


def _record(msg: str, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("outbox.relay", logging.WARNING, __file__, 1, msg, None, None)
    record.__dict__.update(extra)
    return record


def test_json_lines_carry_extra_fields() -> None:
    line = JsonFormatter().format(_record("relay error", table="saga.outbox", saga_ids=["s-1", "s-2"]))
    parsed = orjson.loads(line)
    assert (
        parsed["msg"] == "relay error" and parsed["level"] == "warning" and parsed["logger"] == "outbox.relay"
    )
    assert parsed["table"] == "saga.outbox" and parsed["saga_ids"] == ["s-1", "s-2"]
    assert "args" not in parsed and "lineno" not in parsed


def test_key_value_lines_quote_values_with_spaces() -> None:
    line = KeyValueFormatter().format(_record("relay error", table="saga.outbox", error="Kafka down"))
    assert line.endswith('warning outbox.relay "relay error" table=saga.outbox error="Kafka down"')


def test_configure_logging_replaces_root_handlers(capsys: pytest.CaptureFixture[str]) -> None:
    root, client = logging.getLogger(), logging.getLogger("aiokafka")
    saved = root.handlers[:], root.level, client.level
    try:
        configure_logging("INFO")
        configure_logging("INFO")
        assert len(root.handlers) == 1
        logging.getLogger("t").info("hello", extra={"saga_id": "s-9"})
        assert orjson.loads(capsys.readouterr().err.strip())["saga_id"] == "s-9"
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        client.setLevel(saved[2])


def test_an_error_the_kafka_client_retries_itself_is_hidden_unless_debugging(
        capsys: pytest.CaptureFixture[str]) -> None:
    from aiokafka.errors import NotLeaderForPartitionError, TopicAuthorizationFailedError

    configure_logging("INFO", "kv")
    try:
        fetcher = logging.getLogger("aiokafka.consumer.fetcher")
        fetcher.error("Failed fetch offsets from %s: %s", 1, NotLeaderForPartitionError())  # retried by aiokafka
        fetcher.error("Failed fetch offsets from %s: %s", 1, ValueError("a bug"))
        assert NotLeaderForPartitionError.retriable and not TopicAuthorizationFailedError.retriable
        fetcher.error("not allowed: %s", TopicAuthorizationFailedError())
        logging.getLogger("aiokafka.conn").info("the Kafka client's chatter below WARNING")
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 2 and "a bug" in lines[0] and "TopicAuthorizationFailed" in lines[1]
        logging.getLogger("aiokafka").setLevel(logging.DEBUG)
        fetcher.error("Failed fetch offsets from %s: %s", 1, NotLeaderForPartitionError())
        assert "NotLeaderForPartitionError" in capsys.readouterr().err
    finally:
        logging.getLogger().handlers.clear()
        logging.getLogger("aiokafka").setLevel(logging.NOTSET)
