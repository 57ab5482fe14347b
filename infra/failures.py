"""The one failure classifier: what an error says about who must act.

Every service, the participant kit, the relay, the start-up waits and the command line ask ``classify``; none
keeps a list of "transient" errors of its own (``tests/unit/test_failures.py`` fails when one does).

- ``Fault.PLATFORM``: Postgres or Kafka cannot work right now (a lost or refused connection, a server shutting
  down, crashed, still starting or no longer the primary, out of disk, memory or connections, an I/O error, a
  broker without a leader, a timeout). Wait it out with backoff, the work unacknowledged; it never spends a
  step's attempts, a poison attempt or a retry budget.
- ``Fault.CONFLICT``: a concurrent transaction won (a serialization failure, a deadlock, the event store's
  optimistic-concurrency check). Retry at once: the next try reads what the winner wrote.
- ``Fault.RECORD``: everything else, a bug or a poison message, about this record or saga; a statement timeout
  (57014) too, since the statement that ran too long will run too long again. Isolate it (``infra.isolation``).

Postgres errors are told apart by SQLSTATE (the class, its first two characters, or the whole code), as the
server reports them; asyncpg's own client errors and Kafka's by type, and where asyncpg gives a connection the
server is closing no type of its own, by what it says (``ASYNCPG_CONNECTION_CLOSING``).
"""

from __future__ import annotations

import errno
import socket
import ssl
from enum import StrEnum

import asyncpg
from aiokafka import errors as kafka_errors

__all__ = ["Fault", "PlatformUnavailable", "WriteConflict", "classify", "describe"]


class Fault(StrEnum):
    """Who must act on a failure."""

    PLATFORM = "platform"  # wait, unacknowledged
    CONFLICT = "conflict"  # retry at once
    RECORD = "record"  # isolate the record or saga


class WriteConflict(Exception):
    """Raised by a store when another writer won (e.g. appended the same event seq first): retry at once."""

    retriable = True


class PlatformUnavailable(Exception):
    """Raised by a service when it knows the platform cannot serve it right now (e.g. an outbox relay whose
    leases were not renewed in time): wait."""

    retriable = True


PLATFORM_SQLSTATE_CLASSES = {
    "08": "connection exception",
    "53": "insufficient resources (disk full, out of memory, too many connections)",
    "58": "system error (an I/O error)",
}
PLATFORM_SQLSTATES = {
    "57P01": "admin shutdown",
    "57P02": "crash shutdown",
    "57P03": "cannot connect now (starting up)",
    "57P05": "idle session timeout: the server closed the connection",
    "25006": "read-only transaction: the server became a standby (a failover) and the primary is elsewhere",
}
CONFLICT_SQLSTATES = {
    "40001": "serialization failure",
    "40P01": "deadlock detected",
}

# asyncpg's client-side errors about the value or the call, not the connection.
_ASYNCPG_CALL_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.DataError,
    asyncpg.exceptions.ClientConfigurationError,
    asyncpg.exceptions.UnsupportedClientFeatureError,
    asyncpg.exceptions.UnsupportedServerFeatureError,
)
# What asyncpg says, in an InternalClientError of no subclass, when a statement meets a connection whose server
# is closing it: the server's FATAL notice (a fast shutdown, a terminated backend) has been read, the end of the
# socket not yet, so the protocol is still waiting for a reply that will never come. A restart of Postgres under
# load raises "cannot switch to state 12; another operation (2) is in progress" on a pooled idle connection.
ASYNCPG_CONNECTION_CLOSING = (
    "cannot switch to state",  # ...; another operation (N) is in progress / ...; protocol is in the "failed" state
    'cannot switch to "idle" state',  # ...; protocol is in the "failed" state
    "not connected",
)
# asyncpg's client errors that mean the server cannot serve this connection now, whatever the statement.
_ASYNCPG_AWAY: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.TargetServerAttributeNotMatched,  # a standby where a primary was asked for (a failover)
)
# A TLS connection the server closed: its end seen by the TLS layer before the socket's.
_TLS_CLOSED: tuple[type[BaseException], ...] = (ssl.SSLEOFError, ssl.SSLZeroReturnError)
# Kafka errors aiokafka does not mark retriable that still mean the cluster is not reachable or not serving now.
_KAFKA_AWAY: tuple[type[BaseException], ...] = (
    kafka_errors.KafkaTimeoutError,
    kafka_errors.KafkaConnectionError,
    kafka_errors.KafkaUnavailableError,
    kafka_errors.NoBrokersAvailable,
    kafka_errors.ProducerClosed,
)
# errno values of an OSError that mean the network or the host's resources, not the program's own files.
_PLATFORM_ERRNOS = frozenset({
    errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED, errno.EPIPE, errno.ETIMEDOUT, errno.EHOSTUNREACH,
    errno.EHOSTDOWN, errno.ENETUNREACH, errno.ENETDOWN, errno.ENETRESET, errno.ENOSPC, errno.EDQUOT, errno.ENOMEM,
    errno.EMFILE, errno.ENFILE, errno.EAGAIN,
})


def classify(error: BaseException) -> Fault:
    """Who must act on ``error``. An error raised ``from`` another (a wrapper) is the platform's or a
    conflict when its cause is."""
    fault = _own_fault(error)
    cause = error.__cause__
    while fault is Fault.RECORD and cause is not None:
        fault, cause = _own_fault(cause), cause.__cause__
    return fault


def describe(error: BaseException) -> str:
    """``error`` in one line for logs and ``/ready``: its type, SQLSTATE when it has one, and its message."""
    code = _sqlstate(error)
    text = str(error).splitlines()[0] if str(error) else ""
    name = type(error).__name__ if code is None else f"{type(error).__name__} ({code})"
    return f"{name}: {text}" if text else name


def _own_fault(error: BaseException) -> Fault:
    if isinstance(error, WriteConflict):
        return Fault.CONFLICT
    if isinstance(error, PlatformUnavailable):
        return Fault.PLATFORM
    code = _sqlstate(error)
    if code is not None:
        if code in CONFLICT_SQLSTATES:
            return Fault.CONFLICT
        if code[:2] in PLATFORM_SQLSTATE_CLASSES or code in PLATFORM_SQLSTATES:
            return Fault.PLATFORM
        if isinstance(error, asyncpg.exceptions.InvalidCachedStatementError):
            return Fault.CONFLICT  # a schema change invalidated a prepared plan: the next try prepares anew
        return Fault.RECORD
    if isinstance(error, asyncpg.exceptions.OutdatedSchemaCacheError):
        return Fault.CONFLICT  # the same, noticed by the client: the next try reloads its type cache
    if isinstance(error, _ASYNCPG_AWAY) or _asyncpg_connection_closing(error):
        return Fault.PLATFORM
    if isinstance(error, asyncpg.InterfaceError):
        # Apart from errors about a value or a call, asyncpg's interface errors mean the connection (or its
        # pool) is closed or unusable: another connection serves.
        return Fault.RECORD if isinstance(error, _ASYNCPG_CALL_ERRORS) else Fault.PLATFORM
    if isinstance(error, kafka_errors.KafkaError):
        return Fault.PLATFORM if error.retriable or isinstance(error, _KAFKA_AWAY) else Fault.RECORD
    if isinstance(error, (TimeoutError, ConnectionError, socket.gaierror, socket.herror, *_TLS_CLOSED)):
        return Fault.PLATFORM
    if isinstance(error, OSError):
        # A bare OSError is how asyncio reports that every address refused a connection; a subclass such as
        # FileNotFoundError is the program's own business.
        if type(error) is OSError or error.errno in _PLATFORM_ERRNOS:
            return Fault.PLATFORM
    return Fault.RECORD


def _asyncpg_connection_closing(error: BaseException) -> bool:
    # Only the base class: its subclasses (a protocol error, an outdated type cache) say what they are by type.
    if type(error) is not asyncpg.exceptions.InternalClientError:
        return False
    text = str(error)
    return any(text.startswith(words) for words in ASYNCPG_CONNECTION_CLOSING)


def _sqlstate(error: BaseException) -> str | None:
    code = getattr(error, "sqlstate", None) if isinstance(error, asyncpg.PostgresError) else None
    return code if isinstance(code, str) and len(code) == 5 else None
