"""The kinds of malformed record ``PoisonFactory`` builds: one builder per kind, and the topic roles it fits.

A builder takes the factory (its seeded random source and value helpers), the topic's role and the topic,
and returns the record's key, value and headers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.codec import HEADER_SIZE, MARKER
from saga_orchestrator.schemas.limits import MAX_VALUE_BYTES
from saga_orchestrator.schemas.message_types import CancelSaga, StartSaga

if TYPE_CHECKING:
    from tests.chaos.tools.poison import PoisonFactory

Role = Literal["start", "control", "results", "commands"]
ROLES: tuple[Role, ...] = ("start", "control", "results", "commands")
Headers = tuple[tuple[str, bytes | None], ...]
Built = tuple[bytes | None, bytes | None, Headers]

BROKER_MAX_BATCH = 1_048_588  # Kafka's default message.max.bytes: the largest record batch a topic takes
RECORD_BATCH_OVERHEAD = 61  # v2 record batch header
OVERSIZED_ID_LENGTH = 8_000  # far beyond a Postgres btree entry (~2.7 kB): never storable as a key
ABOVE_CODEC_LIMIT = MAX_VALUE_BYTES + 4_096
NEEDS_LARGE_TOPICS = frozenset({"above_codec_limit", "start_near_codec_limit"})  # records above ~1 MiB


@dataclass(frozen=True)
class Kind:
    """A kind of malformation, the topic roles it applies to, and whether it is large (sent sparingly)."""

    name: str
    roles: frozenset[Role]
    build: Callable[[PoisonFactory, Role, str], Built]
    huge: bool = False


def _keyed(build: Callable[[PoisonFactory, Role, str, str], bytes | None]) -> Callable[
        [PoisonFactory, Role, str], Built]:
    """A builder whose key is a fresh saga id and whose headers carry a fresh message id."""

    def wrapped(f: PoisonFactory, role: Role, topic: str) -> Built:
        saga_id = f.saga_id()
        return saga_id.encode(), build(f, role, topic, saga_id), f.message_id()

    return wrapped


def _valid(f: PoisonFactory, role: Role, topic: str, saga_id: str) -> bytes:
    return f.valid_value(role, topic, saga_id)


def _truncated(f: PoisonFactory, role: Role, topic: str, saga_id: str) -> bytes:
    value = f.valid_value(role, topic, saga_id)
    return value[: f.rng.randint(HEADER_SIZE, len(value) - 1)]


def _missing_key(f: PoisonFactory, role: Role, topic: str) -> Built:
    return None, f.valid_value(role, topic, f.saga_id()), f.message_id()


def _key_mismatch(f: PoisonFactory, role: Role, topic: str) -> Built:
    return f.saga_id().encode(), f.valid_value(role, topic, f.saga_id()), f.message_id()


def _non_utf8_key(f: PoisonFactory, role: Role, topic: str) -> Built:
    saga_id = f.saga_id()
    return b"\xff\xfe" + saga_id.encode(), f.valid_value(role, topic, saga_id), f.message_id()


def _bad_headers(f: PoisonFactory, role: Role, topic: str) -> Built:
    """Non-UTF-8 message id, the same header twice, None header values; the value is bad too (a
    valid value with odd headers is a valid message: headers are optional)."""
    saga_id = f.saga_id()
    value = f.rng.choice([_truncated(f, role, topic, saga_id), f.random_bytes()])
    headers: Headers = (("message_id", b"\xff\xfe\xfd" + f.rng.randbytes(4)), ("message_id", b"second"),
                        ("saga_id", None), ("causation_id", None), ("saga_type", b"\xc3\x28"))
    return saga_id.encode(), value, headers


def _oversized_id(f: PoisonFactory, role: Role, topic: str) -> Built:
    """A saga id far too long to be one (no store can key on it), key and body agreeing."""
    saga_id = f"{f.run_id}-long-" + f.rng.randbytes(OVERSIZED_ID_LENGTH // 2).hex()
    return saga_id.encode(), f.valid_value(role, topic, saga_id), f.message_id()


def _nul_in_id(f: PoisonFactory, role: Role, topic: str) -> Built:
    """A saga id with a NUL character (valid UTF-8, but no Postgres text can hold it), key and body agreeing."""
    saga_id = f"{f.saga_id()}\x00nul"
    return saga_id.encode(), f.valid_value(role, topic, saga_id), f.message_id()


def _nul_in_text(f: PoisonFactory, role: Role, topic: str) -> Built:
    """A NUL character in a text field other than the saga id."""
    saga_id = f.saga_id()
    if role == "start":
        value = wire.encode_start(StartSaga(saga_id=saga_id, saga_type="trip", tenant_id="tenant\x00",
                                            input=f.trip_input(saga_id)))
    elif role == "control":
        value = wire.encode_cancel(CancelSaga(saga_id=saga_id, reason="nul\x00reason"))
    elif role == "results":
        value = wire.encode_result(dataclasses.replace(f.result(saga_id), error_message="nul\x00"))
    else:
        _, record = f.registry.decode(f.command(topic, saga_id))
        value = f.registry.encode("saga.v1.StepCommand", {**record, "step": "step\x00nul"})
    return saga_id.encode(), value, f.message_id()


def _oversized_message_id(f: PoisonFactory, role: Role, topic: str) -> Built:
    """A message id header too long to be one, on an otherwise dead-letter-bound message."""
    saga_id = f.saga_id()
    message_id = f.rng.randbytes(OVERSIZED_ID_LENGTH // 2).hex()
    if role == "start":
        value = wire.encode_start(StartSaga(saga_id=saga_id, saga_type="cruise", tenant_id=None,
                                            input=f.trip_input(saga_id)))
    else:  # a cancel / result for a saga that does not exist
        value = f.valid_value(role, topic, saga_id)
    return saga_id.encode(), value, (("message_id", message_id.encode()),)


def _start(saga_type: str = "trip", input_of: Callable[[PoisonFactory, str], bytes] | None = None,
           saga_id_of: Callable[[PoisonFactory], str] | None = None) -> Callable[
        [PoisonFactory, Role, str], Built]:
    def build(f: PoisonFactory, role: Role, topic: str) -> Built:
        saga_id = saga_id_of(f) if saga_id_of else f.saga_id()
        saga_input = input_of(f, saga_id) if input_of else f.trip_input(saga_id)
        value = wire.encode_start(StartSaga(saga_id=saga_id, saga_type=saga_type, tenant_id=None, input=saga_input))
        return saga_id.encode(), value, f.message_id()

    return build


def _huge(size_of: Callable[[PoisonFactory], int]) -> Callable[
        [PoisonFactory, Role, str], Built]:
    def build(f: PoisonFactory, role: Role, topic: str) -> Built:
        saga_id = f.saga_id()
        headers = f.message_id()
        return saga_id.encode(), f.sized_garbage(size_of(f) - len(saga_id) - len(headers[0][1] or b"") - 64), headers

    return build


def _start_near_codec_limit(f: PoisonFactory, role: Role, topic: str) -> Built:
    """A well-formed StartSaga just under the codec's limit (a huge tenant id): its SagaStarted event, a few
    bytes bigger, could never be encoded, stored or published."""
    saga_id = f.saga_id()
    start = StartSaga(saga_id=saga_id, saga_type="trip", tenant_id="", input=f.trip_input(saga_id))
    padding = MAX_VALUE_BYTES - 8 - len(wire.encode_start(start)) - 4  # -4: the longer length varint
    value = wire.encode_start(dataclasses.replace(start, tenant_id="t" * padding))
    return saga_id.encode(), value, f.message_id()


ALL: frozenset[Role] = frozenset(ROLES)
START: frozenset[Role] = frozenset({"start"})

KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("random_bytes", ALL, _keyed(lambda f, r, t, s: f.random_bytes())),
    Kind("short_header", ALL, _keyed(lambda f, r, t, s: MARKER + f.rng.randbytes(f.rng.randint(0, 7)))),
    Kind("unknown_fingerprint", ALL,
         _keyed(lambda f, r, t, s: MARKER + f.unknown_fingerprint() + _valid(f, r, t, s)[HEADER_SIZE:])),
    Kind("header_random_body", ALL,
         _keyed(lambda f, r, t, s: _valid(f, r, t, s)[:HEADER_SIZE] + f.random_bytes(1, 64))),
    Kind("truncated", ALL, _keyed(_truncated)),
    Kind("trailing_garbage", ALL, _keyed(lambda f, r, t, s: _valid(f, r, t, s) + f.random_bytes(1, 32))),
    Kind("wrong_schema", ALL, _keyed(lambda f, r, t, s: f.wrong_schema_value(r, s))),
    Kind("empty_value", ALL, _keyed(lambda f, r, t, s: b"")),
    Kind("tombstone", ALL, _keyed(lambda f, r, t, s: None)),
    Kind("missing_key", ALL, _missing_key),
    Kind("key_mismatch", ALL, _key_mismatch),
    Kind("non_utf8_key", ALL, _non_utf8_key),
    Kind("bad_headers", ALL, _bad_headers),
    Kind("oversized_id", ALL, _oversized_id),
    Kind("nul_in_id", ALL, _nul_in_id),
    Kind("nul_in_text", ALL, _nul_in_text),
    Kind("oversized_message_id", frozenset({"start", "control", "results"}), _oversized_message_id),
    Kind("bad_enum", frozenset({"results", "commands"}), _keyed(lambda f, r, t, s: f.bad_enum_value(r, t, s))),
    Kind("unknown_saga", frozenset({"control", "results"}), _keyed(_valid)),
    Kind("unknown_saga_type", START, _start(saga_type="cruise")),
    Kind("input_undecodable", START, _start(input_of=lambda f, s: f.random_bytes())),
    Kind("input_truncated", START, _start(input_of=lambda f, s: f.trip_input(s)[:-3])),
    Kind("input_unknown_fingerprint", START,
         _start(input_of=lambda f, s: MARKER + f.unknown_fingerprint() + f.trip_input(s)[HEADER_SIZE:])),
    Kind("input_wrong_schema", START,
         _start(input_of=lambda f, s: wire.encode_cancel(CancelSaga(saga_id=s, reason="not a trip")))),
    Kind("empty_saga_id", START, _start(saga_id_of=lambda f: "")),
    Kind("command_input_undecodable", frozenset({"commands"}),
         _keyed(lambda f, r, t, s: f.command(t, s, input_value=f.random_bytes()))),
    Kind("huge_value", ALL, _huge(lambda f: 1_000_000), huge=True),
    # The largest record the topic takes: a dead letter carrying it whole cannot fit the DLQ topic.
    Kind("near_broker_limit", ALL, _huge(lambda f: BROKER_MAX_BATCH - RECORD_BATCH_OVERHEAD), huge=True),
    Kind("above_codec_limit", ALL, _huge(lambda f: ABOVE_CODEC_LIMIT), huge=True),
    Kind("start_near_codec_limit", START, _start_near_codec_limit, huge=True),
)}


def kinds() -> Iterator[str]:
    """Every kind name."""
    return iter(KINDS)
