"""The one failure classifier: a row per SQLSTATE class and per error type, and no second list anywhere.

``infra.failures.classify`` decides for every service whether a failure is the platform's (wait it out), a
conflict (retry at once) or the record's (isolate it). A module that names a platform or conflict error class
itself (in an ``except``, an ``isinstance`` or a tuple of its own) is a second home for that decision: the
last test fails on it.
"""

from __future__ import annotations

import ast
import errno
import importlib
import inspect
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from aiokafka import errors as kafka_errors

from saga_orchestrator.infra.failures import Fault, PlatformUnavailable, WriteConflict, classify, describe
from saga_orchestrator.orchestrator.domain.errors import DomainError
from saga_orchestrator.orchestrator.ports import ConcurrencyConflict
from saga_orchestrator.outbox.publishing import MissingTopic
from saga_orchestrator.schemas.codec import WireError

PLATFORM, CONFLICT, RECORD = Fault.PLATFORM, Fault.CONFLICT, Fault.RECORD
ROOT = Path(__file__).resolve().parents[2]


def _postgres_error(sqlstate: str) -> asyncpg.PostgresError:
    """asyncpg's exception for ``sqlstate`` (as it raises it for a server error with that code)."""
    cls = asyncpg.PostgresError.get_message_class_for_sqlstate(sqlstate)
    error: asyncpg.PostgresError = cls(f"server says {sqlstate}")
    if error.sqlstate != sqlstate:  # a code asyncpg has no class of its own for: its class's base
        error.sqlstate = sqlstate
    return error


# One row per SQLSTATE class of errors Postgres raises (the class's general code), and the codes decided one by
# one. (Classes 00-02 are success, warnings and "no data": never raised.)
SQLSTATE_CLASSES = [
    ("03000", RECORD),  # SQL statement not yet complete
    ("08000", PLATFORM),  # connection exception
    ("08003", PLATFORM),  # connection does not exist
    ("08006", PLATFORM),  # connection failure
    ("09000", RECORD),  # triggered action exception
    ("0A000", RECORD),  # feature not supported
    ("0B000", RECORD),  # invalid transaction initiation
    ("0F000", RECORD),  # locator exception
    ("0L000", RECORD),  # invalid grantor
    ("0P000", RECORD),  # invalid role specification
    ("0Z000", RECORD),  # diagnostics exception
    ("10608", RECORD),  # invalid argument for XQuery (class 10)
    ("20000", RECORD),  # case not found
    ("21000", RECORD),  # cardinality violation
    ("22000", RECORD),  # data exception
    ("22P02", RECORD),  # invalid text representation
    ("23000", RECORD),  # integrity constraint violation
    ("23505", RECORD),  # unique violation (the event store turns its own into a ConcurrencyConflict)
    ("24000", RECORD),  # invalid cursor state
    ("25000", RECORD),  # invalid transaction state
    ("25006", PLATFORM),  # read-only SQL transaction: the server became a standby (a failover)
    ("25P02", RECORD),  # in failed SQL transaction
    ("25P03", RECORD),  # idle in transaction session timeout: the work held its transaction too long
    ("26000", RECORD),  # invalid SQL statement name
    ("27000", RECORD),  # triggered data change violation
    ("28000", RECORD),  # invalid authorization specification
    ("28P01", RECORD),  # invalid password: a setting to fix, not to wait for
    ("2B000", RECORD),  # dependent privilege descriptors still exist
    ("2D000", RECORD),  # invalid transaction termination
    ("2F000", RECORD),  # SQL routine exception
    ("34000", RECORD),  # invalid cursor name
    ("38000", RECORD),  # external routine exception
    ("39000", RECORD),  # external routine invocation exception
    ("3B000", RECORD),  # savepoint exception
    ("3D000", RECORD),  # invalid catalog name (no such database)
    ("3F000", RECORD),  # invalid schema name
    ("40000", RECORD),  # transaction rollback
    ("40001", CONFLICT),  # serialization failure
    ("40P01", CONFLICT),  # deadlock detected
    ("40002", RECORD),  # transaction integrity constraint violation
    ("42000", RECORD),  # syntax error or access rule violation
    ("42501", RECORD),  # insufficient privilege
    ("42P01", RECORD),  # undefined table
    ("44000", RECORD),  # with check option violation
    ("53000", PLATFORM),  # insufficient resources
    ("53100", PLATFORM),  # disk full
    ("53200", PLATFORM),  # out of memory
    ("53300", PLATFORM),  # too many connections
    ("53400", PLATFORM),  # configuration limit exceeded
    ("54000", RECORD),  # program limit exceeded
    ("55000", RECORD),  # object not in prerequisite state
    ("55P03", RECORD),  # lock not available
    ("57000", RECORD),  # operator intervention
    ("57014", RECORD),  # query canceled: a statement timeout runs too long again
    ("57P01", PLATFORM),  # admin shutdown (also pg_terminate_backend)
    ("57P02", PLATFORM),  # crash shutdown
    ("57P03", PLATFORM),  # cannot connect now
    ("57P04", RECORD),  # database dropped
    ("57P05", PLATFORM),  # idle session timeout
    ("58000", PLATFORM),  # system error
    ("58030", PLATFORM),  # I/O error
    ("72000", RECORD),  # snapshot too old
    ("F0000", RECORD),  # configuration file error
    ("HV000", RECORD),  # foreign data wrapper error
    ("P0001", RECORD),  # raise exception (a trigger or function raised)
    ("XX000", RECORD),  # internal error
    ("XX001", RECORD),  # data corrupted
]


@pytest.mark.parametrize(("sqlstate", "fault"), SQLSTATE_CLASSES, ids=[code for code, _ in SQLSTATE_CLASSES])
def test_a_postgres_error_is_classified_by_its_sqlstate(sqlstate: str, fault: Fault) -> None:
    error = _postgres_error(sqlstate)
    assert classify(error) is fault
    assert f"({sqlstate})" in describe(error)


def test_every_sqlstate_class_has_a_row() -> None:
    codes = [getattr(cls, "sqlstate", None) for _, cls in inspect.getmembers(asyncpg.exceptions, inspect.isclass)
             if issubclass(cls, asyncpg.PostgresError)]
    classes = {code[:2] for code in codes if isinstance(code, str)}
    assert classes <= {code[:2] for code, _ in SQLSTATE_CLASSES}


class _KafkaCase(kafka_errors.KafkaError):  # type: ignore[misc]  # aiokafka is untyped
    retriable = True


_InternalClientError = asyncpg.exceptions.InternalClientError

ERRORS: list[tuple[BaseException, Fault]] = [
    # asyncpg's own client errors: a connection the server closed or is closing, by type...
    (asyncpg.InterfaceError("connection is closed"), PLATFORM),
    (asyncpg.InterfaceError("cannot perform operation: connection is closed"), PLATFORM),
    (asyncpg.InterfaceError("cannot call Connection.fetch(): connection has been released back to the pool"), PLATFORM),
    (asyncpg.InterfaceError("cannot perform operation: another operation is in progress"), PLATFORM),
    (asyncpg.InterfaceError("pool is closing"), PLATFORM),
    (asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed in the middle of operation"), PLATFORM),
    (asyncpg.exceptions.TargetServerAttributeNotMatched("none of the hosts match target_session_attrs"), PLATFORM),
    # ... and where asyncpg has no type for it, by what it says: the server's FATAL notice was read, the socket's
    # end not yet (tests/chaos/test_restart_ladders.py meets them in a real restart)
    (_InternalClientError("cannot switch to state 12; another operation (2) is in progress"), PLATFORM),
    (_InternalClientError("cannot switch to state 15; another operation (2) is in progress"), PLATFORM),
    (_InternalClientError('cannot switch to state 11; protocol is in the "failed" state'), PLATFORM),
    (_InternalClientError('cannot switch to "idle" state; protocol is in the "failed" state'), PLATFORM),
    (_InternalClientError("not connected"), PLATFORM),
    # the rest of asyncpg's internal errors are about the statement or a bug: isolated, never waited on forever
    (_InternalClientError("could not resolve query result and/or argument types in 6 attempts"), RECORD),
    (asyncpg.exceptions.ProtocolError("unexpected message in the protocol"), RECORD),
    (asyncpg.exceptions.DataError("invalid input for query argument $1"), RECORD),
    (asyncpg.exceptions.ClientConfigurationError("bad option"), RECORD),
    (asyncpg.exceptions.OutdatedSchemaCacheError("cached statement plan is invalid"), CONFLICT),
    (asyncpg.exceptions.InvalidCachedStatementError("cached statement plan is invalid"), CONFLICT),
    # the network and the host
    (ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed"), PLATFORM),
    (ConnectionResetError(errno.ECONNRESET, "reset by peer"), PLATFORM),
    (OSError("Multiple exceptions: [Errno 111] Connect call failed"), PLATFORM),
    (OSError(errno.ENOSPC, "No space left on device"), PLATFORM),
    (OSError(errno.EHOSTUNREACH, "No route to host"), PLATFORM),
    (socket.gaierror(-2, "Name or service not known"), PLATFORM),
    (ssl.SSLEOFError(8, "EOF occurred in violation of protocol"), PLATFORM),  # a TLS connection the server closed
    (ssl.SSLZeroReturnError(6, "TLS/SSL connection has been closed (EOF)"), PLATFORM),
    (ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number"), RECORD),  # a setting to fix
    (TimeoutError(), PLATFORM),
    (FileNotFoundError(errno.ENOENT, "No such file"), RECORD),
    (PermissionError(errno.EACCES, "Permission denied"), RECORD),
    # Kafka: what aiokafka marks retriable, unknown leaders, timeouts; the rest is about the records
    (kafka_errors.KafkaConnectionError("no broker"), PLATFORM),
    (kafka_errors.KafkaTimeoutError(), PLATFORM),
    (kafka_errors.RequestTimedOutError(), PLATFORM),
    (kafka_errors.NodeNotReadyError(), PLATFORM),
    (kafka_errors.LeaderNotAvailableError(), PLATFORM),
    (kafka_errors.NotLeaderForPartitionError(), PLATFORM),
    (kafka_errors.UnknownTopicOrPartitionError(), PLATFORM),
    (kafka_errors.NotEnoughReplicasError(), PLATFORM),
    (kafka_errors.KafkaStorageError(), PLATFORM),
    (kafka_errors.NoBrokersAvailable(), PLATFORM),
    (kafka_errors.KafkaUnavailableError(), PLATFORM),
    (kafka_errors.ProducerClosed(), PLATFORM),
    (_KafkaCase(), PLATFORM),
    (kafka_errors.MessageSizeTooLargeError(), RECORD),
    (kafka_errors.RecordTooLargeError(), RECORD),
    (kafka_errors.TopicAuthorizationFailedError(), RECORD),
    (kafka_errors.InvalidTopicError(), RECORD),
    (kafka_errors.CorruptRecordException(), RECORD),
    (kafka_errors.KafkaError("anything else"), RECORD),
    (MissingTopic(["gone.commands"]), RECORD),
    # the services' own
    (ConcurrencyConflict("seq 4 of saga s-1 taken"), CONFLICT),
    (WriteConflict(), CONFLICT),
    (PlatformUnavailable("leases not renewed"), PLATFORM),
    (DomainError("history does not fold"), RECORD),
    (WireError("unknown writer schema fingerprint"), RECORD),
    (ValueError("a bug"), RECORD),
    (RuntimeError("a bug"), RECORD),
    (KeyError("a bug"), RECORD),
]


@pytest.mark.parametrize(("error", "fault"), ERRORS, ids=[f"{type(e).__name__}-{i}" for i, (e, _) in enumerate(ERRORS)])
def test_an_error_is_classified_by_its_type(error: BaseException, fault: Fault) -> None:
    assert classify(error) is fault


def test_a_wrapper_is_classified_by_its_cause() -> None:
    def raised(error: Exception, cause: BaseException) -> Exception:
        try:
            raise error from cause
        except Exception as wrapped:
            return wrapped

    assert classify(raised(RuntimeError("batch failed"), _postgres_error("53100"))) is PLATFORM
    assert classify(raised(RuntimeError("batch failed"), ConcurrencyConflict("seq"))) is CONFLICT
    assert classify(raised(RuntimeError("batch failed"), ValueError("bad"))) is RECORD
    # A record fault of its own keeps it, whatever it came from.
    assert classify(raised(ConcurrencyConflict("seq"), _postgres_error("53100"))) is CONFLICT
    # Two wrappers deep.
    inner = raised(RuntimeError("inner"), kafka_errors.KafkaConnectionError())
    assert classify(raised(ValueError("outer"), inner)) is PLATFORM


def test_describe_names_the_type_the_code_and_the_first_line() -> None:
    error = _postgres_error("53100")
    assert describe(error) == "DiskFullError (53100): server says 53100"
    assert describe(TimeoutError()) == "TimeoutError"
    assert describe(ValueError("one\ntwo")) == "ValueError: one"


# -- no second home ------------------------------------------------------------------------------------------

HOMES = {"infra/failures.py", "infra/isolation.py"}
# The local launcher starts and stops processes and reads their files on the developer's machine: none of its
# OSErrors is about a dependency of saga work.
OUTSIDE = ("infra/launcher/",)
PARTS = ("orchestrator", "outbox", "participants", "schemas", "infra", "cli", "client")


def _modules() -> Iterator[tuple[str, str]]:
    for part in PARTS:
        for path in sorted((ROOT / part).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative in HOMES or relative.startswith(OUTSIDE) or path.name == "__main__.py":
                continue
            name = "saga_orchestrator." + relative.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
            yield relative, name


def _named_classes(node: ast.expr, namespace: dict[str, object]) -> Iterator[tuple[str, type]]:
    """The exception classes an expression names (a name, a dotted name, a tuple of them)."""
    parts = node.elts if isinstance(node, ast.Tuple) else [node]
    for part in parts:
        if isinstance(part, ast.Starred):
            continue
        try:
            value = eval(compile(ast.Expression(part), "<expr>", "eval"), namespace)
        except Exception:
            continue
        classes = value if isinstance(value, tuple) else (value,)
        for cls in classes:
            if isinstance(cls, type) and issubclass(cls, BaseException):
                yield ast.unparse(part), cls


def _decides_platform_or_conflict(cls: type[BaseException]) -> bool:
    """Whether naming ``cls`` decides what only the classifier may: an error of it is the platform's or a
    conflict. (Catching ``Exception`` and asking ``classify`` is how a service decides.)"""
    if cls in (BaseException, Exception):
        return False
    try:
        instance = cls.__new__(cls)
    except TypeError:
        return False
    return classify(instance) is not RECORD


def _decisions(tree: ast.AST) -> Iterator[ast.expr]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler) and node.type is not None:
            yield node.type
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in {"isinstance", "issubclass"} and len(node.args) == 2):
            yield node.args[1]
        elif isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Tuple):
            yield node.value


def test_no_module_keeps_a_list_of_platform_or_conflict_errors_of_its_own() -> None:
    found = []
    for relative, name in _modules():
        module = importlib.import_module(name)
        namespace = dict(vars(module))
        for expression in _decisions(ast.parse((ROOT / relative).read_text())):
            for text, cls in _named_classes(expression, namespace):
                # A module's own exception, raised and handled there, is no list of anyone's errors.
                if cls.__module__ != name and _decides_platform_or_conflict(cls):
                    found.append(f"{relative}:{expression.lineno}: {text}")
    assert not found, "ask infra.failures.classify instead: " + "; ".join(found)


def test_the_check_finds_a_list_of_its_own(tmp_path: Path) -> None:
    source = ("import asyncpg\n_GONE = (asyncpg.PostgresConnectionError, OSError)\n"
              "try:\n    pass\nexcept asyncpg.DiskFullError:\n    pass\n")
    namespace: dict[str, object] = {"asyncpg": asyncpg}
    named = [cls for expression in _decisions(ast.parse(source)) for _, cls in _named_classes(expression, namespace)]
    assert [cls for cls in named if _decides_platform_or_conflict(cls)] == [
        asyncpg.PostgresConnectionError, OSError, asyncpg.DiskFullError]
