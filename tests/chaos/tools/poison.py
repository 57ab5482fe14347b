"""Malformed Kafka records for every topic a service consumes: a seeded, reusable poison generator.

Each record is built to be *detectably* bad for the consumer of its topic (the orchestrator for
``saga.start``, ``saga.control`` and ``<p>.results``; participant p for ``<p>.commands``), so the only
right outcome is one dead letter on ``saga.dlq`` and no business effect. Nothing here starts a saga or
makes a participant act: a message that is merely unusual but valid does not belong in this module.

    factory = PoisonFactory(Topics(prefix), seed=7)
    records = factory.generate(10_000)          # every applicable kind on every consumed topic
"""

from __future__ import annotations

import copy
import io
import itertools
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import fastavro

from orchestrator import wire
from orchestrator.domain.messages import CancelSaga, CommandKind, ResultStatus, StartSaga, StepResult
from schemas.codec import HEADER_SIZE, MARKER
from schemas.registry import DEFAULT_MAX_VALUE_SIZE, SchemaRegistry, default_registry
from schemas.topics import PARTICIPANTS, Topics

Role = Literal["start", "control", "results", "commands"]
ROLES: tuple[Role, ...] = ("start", "control", "results", "commands")
Headers = tuple[tuple[str, bytes | None], ...]

TRIP_REQUEST = "saga.v1.trip.TripRequest"
BROKER_MAX_BATCH = 1_048_588  # Kafka's default message.max.bytes: the largest record batch a topic takes
RECORD_BATCH_OVERHEAD = 61  # v2 record batch header
OVERSIZED_ID_LENGTH = 8_000  # far beyond a Postgres btree entry (~2.7 kB): never storable as a key
ABOVE_CODEC_LIMIT = DEFAULT_MAX_VALUE_SIZE + 4_096


@dataclass(frozen=True)
class PoisonRecord:
    """One malformed record: where it goes and its exact key, value and headers."""

    kind: str
    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers = ()

    @property
    def size(self) -> int:
        """Bytes of key, value and headers (what the broker's size limit is about, minus framing)."""
        header_bytes = sum(len(k) + len(v or b"") for k, v in self.headers)
        return len(self.key or b"") + len(self.value or b"") + header_bytes


@dataclass(frozen=True)
class Kind:
    """A kind of malformation, the topic roles it applies to, and whether it is large (sent sparingly)."""

    name: str
    roles: frozenset[Role]
    build: Callable[[PoisonFactory, Role, str], tuple[bytes | None, bytes | None, Headers]]
    huge: bool = False


@dataclass
class PoisonFactory:
    """Builds poison records for the topics of one prefix; deterministic for a given ``seed``."""

    topics: Topics
    participants: tuple[str, ...] = PARTICIPANTS
    seed: int = 0
    run_id: str = "poison"
    include_above_codec_limit: bool = False  # needs topics whose max.message.bytes exceeds the codec limit
    registry: SchemaRegistry = field(default_factory=default_registry)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self._ids = itertools.count(1)
        self._known = {s.fingerprint for s in self.registry.current_schemas()}
        self._known |= {s.fingerprint for s in self.registry.released_schemas()}

    # --- what goes where --------------------------------------------------------------------------

    def roles(self) -> dict[str, Role]:
        """Every consumed topic and the role of its consumer's contract."""
        topics: dict[str, Role] = {self.topics.start: "start", self.topics.control: "control"}
        for name in self.participants:
            topics[self.topics.results(name)] = "results"
            topics[self.topics.commands(name)] = "commands"
        return topics

    def kinds_for(self, role: Role) -> list[Kind]:
        """The kinds applicable to a topic role (above-codec-limit values only when enabled)."""
        return [k for k in KINDS.values() if role in k.roles
                and (self.include_above_codec_limit or k.name != "above_codec_limit")]

    def make(self, kind: str, topic: str) -> PoisonRecord:
        """One record of ``kind`` for ``topic``."""
        role = self.roles()[topic]
        spec = KINDS[kind]
        if role not in spec.roles:
            raise ValueError(f"kind {kind} does not apply to {topic} ({role})")
        key, value, headers = spec.build(self, role, topic)
        return PoisonRecord(kind, topic, key, value, headers)

    def generate(self, count: int, huge_per_topic: int = 1) -> list[PoisonRecord]:
        """``count`` records cycling over every (topic, kind) pair, plus ``huge_per_topic`` records of each
        large kind per topic (counted in ``count``), in a shuffled order."""
        small: list[tuple[str, str]] = []
        records: list[PoisonRecord] = []
        for topic, role in self.roles().items():
            for kind in self.kinds_for(role):
                if kind.huge:
                    records += [self.make(kind.name, topic) for _ in range(huge_per_topic)]
                else:
                    small.append((topic, kind.name))
        for topic, kind_name in itertools.islice(itertools.cycle(small), max(0, count - len(records))):
            records.append(self.make(kind_name, topic))
        self.rng.shuffle(records)
        return records

    # --- building blocks ----------------------------------------------------------------------------

    def saga_id(self) -> str:
        """A fresh saga id no valid saga uses."""
        return f"{self.run_id}-{next(self._ids)}"

    def message_id(self) -> Headers:
        return (("message_id", f"{self.run_id}-msg-{next(self._ids)}".encode()),)

    def trip_input(self, saga_id: str) -> bytes:
        return wire.encode_input(TRIP_REQUEST, {
            "customer_id": f"cust_{saga_id}", "origin": "LIS", "destination": "NYC",
            "depart_date": "2027-03-01", "return_date": "2027-03-09", "currency": "EUR",
            "card_token": "tok_ok", "email": "poison@example.test", "amount_cents": 100,
        })

    def valid_value(self, role: Role, topic: str, saga_id: str) -> bytes:
        """A well-formed value of the topic's own schema, for a saga that does not exist.

        Sent as such it would be handled (a start would start a saga, a command would book a flight), so
        it only ever goes out combined with something that makes it bad.
        """
        if role == "start":
            return wire.encode_start(StartSaga(saga_id=saga_id, saga_type="trip", tenant_id=None,
                                               input=self.trip_input(saga_id)))
        if role == "control":
            return wire.encode_cancel(CancelSaga(saga_id=saga_id, reason="poison"))
        if role == "results":
            return wire.encode_result(self.result(saga_id))
        return self.command(topic, saga_id)

    def result(self, saga_id: str) -> StepResult:
        return StepResult(saga_id=saga_id, step="book_flight", kind=CommandKind.FORWARD,
                          idempotency_key=f"{saga_id}:book_flight", attempt=1, status=ResultStatus.SUCCEEDED)

    def command(self, topic: str, saga_id: str, input_value: bytes | None = None, kind: str = "FORWARD") -> bytes:
        participant = topic.removeprefix(self.topics.prefix).removesuffix(".commands")
        return self.registry.encode("saga.v1.StepCommand", {
            "saga_id": saga_id, "saga_type": "trip", "step": f"step_{participant}", "action": "poison",
            "kind": kind, "idempotency_key": f"{saga_id}:step_{participant}", "attempt": 1,
            "input": self.trip_input(saga_id) if input_value is None else input_value,
        })

    def random_bytes(self, low: int = 1, high: int = 200) -> bytes:
        return self.rng.randbytes(self.rng.randint(low, high))

    def unknown_fingerprint(self) -> bytes:
        while (fingerprint := self.rng.randbytes(8)) in self._known:
            pass  # a collision with one of ~60 known fingerprints is astronomically unlikely; still
        return fingerprint

    def wrong_schema_value(self, role: Role, saga_id: str) -> bytes:
        """A valid value of a schema the topic does not carry (rotating over the candidates)."""
        start = StartSaga(saga_id=saga_id, saga_type="trip", tenant_id=None, input=self.trip_input(saga_id))
        candidates: dict[Role, list[Callable[[], bytes]]] = {
            "start": [lambda: wire.encode_result(self.result(saga_id)),
                      lambda: wire.encode_cancel(CancelSaga(saga_id=saga_id, reason="x")),
                      lambda: self.command(self.topics.commands("flight"), saga_id),
                      lambda: self.event(saga_id), lambda: self.trip_input(saga_id)],
            "control": [lambda: wire.encode_start(start), lambda: wire.encode_result(self.result(saga_id)),
                        lambda: self.event(saga_id)],
            "results": [lambda: wire.encode_start(start), lambda: self.command(self.topics.commands("hotel"), saga_id),
                        lambda: wire.encode_cancel(CancelSaga(saga_id=saga_id, reason="x")),
                        lambda: self.event(saga_id)],
            "commands": [lambda: wire.encode_result(self.result(saga_id)), lambda: wire.encode_start(start),
                         lambda: self.event(saga_id), lambda: self.trip_input(saga_id)],
        }
        return self.rng.choice(candidates[role])()

    def event(self, saga_id: str) -> bytes:
        from orchestrator.domain.events import SagaCompleted

        return wire.encode_event(SagaCompleted(saga_id=saga_id, seq=1, definition_version=1, occurred_at=1))

    def bad_enum_value(self, role: Role, topic: str, saga_id: str) -> bytes:
        """The topic's schema with an enum symbol index the real schema does not have."""
        name = "saga.v1.StepResult" if role == "results" else "saga.v1.StepCommand"
        schema: dict[str, Any] = copy.deepcopy(self.registry.schema(name).schema)
        kind_field = next(f for f in schema["fields"] if f["name"] == "kind")
        kind_field["type"]["symbols"] = [*kind_field["type"]["symbols"], "BOGUS"]
        _, record = self.registry.decode(self.valid_value(role, topic, saga_id))
        record["kind"] = "BOGUS"
        body = io.BytesIO()
        fastavro.schemaless_writer(body, fastavro.parse_schema(schema), record)
        return MARKER + self.registry.fingerprint(name) + body.getvalue()

    def sized_garbage(self, total: int) -> bytes:
        """A value of exactly ``total`` bytes: a real header and a random body (cheap, not random-heavy)."""
        chunk = self.rng.randbytes(4096)
        body = (chunk * (total // len(chunk) + 1))[: total - HEADER_SIZE]
        return MARKER + self.registry.fingerprint("saga.v1.StartSaga") + body


def _keyed(build: Callable[[PoisonFactory, Role, str, str], bytes | None]) -> Callable[
        [PoisonFactory, Role, str], tuple[bytes | None, bytes | None, Headers]]:
    """A builder whose key is a fresh saga id and whose headers carry a fresh message id."""

    def wrapped(f: PoisonFactory, role: Role, topic: str) -> tuple[bytes | None, bytes | None, Headers]:
        saga_id = f.saga_id()
        return saga_id.encode(), build(f, role, topic, saga_id), f.message_id()

    return wrapped


def _valid(f: PoisonFactory, role: Role, topic: str, saga_id: str) -> bytes:
    return f.valid_value(role, topic, saga_id)


def _truncated(f: PoisonFactory, role: Role, topic: str, saga_id: str) -> bytes:
    value = f.valid_value(role, topic, saga_id)
    return value[: f.rng.randint(HEADER_SIZE, len(value) - 1)]


def _missing_key(f: PoisonFactory, role: Role, topic: str) -> tuple[bytes | None, bytes | None, Headers]:
    return None, f.valid_value(role, topic, f.saga_id()), f.message_id()


def _key_mismatch(f: PoisonFactory, role: Role, topic: str) -> tuple[bytes | None, bytes | None, Headers]:
    return f.saga_id().encode(), f.valid_value(role, topic, f.saga_id()), f.message_id()


def _non_utf8_key(f: PoisonFactory, role: Role, topic: str) -> tuple[bytes | None, bytes | None, Headers]:
    saga_id = f.saga_id()
    return b"\xff\xfe" + saga_id.encode(), f.valid_value(role, topic, saga_id), f.message_id()


def _bad_headers(f: PoisonFactory, role: Role, topic: str) -> tuple[bytes | None, bytes | None, Headers]:
    """Non-UTF-8 message id, the same header twice, None header values; the value is bad too (a
    valid value with odd headers is a valid message: headers are optional)."""
    saga_id = f.saga_id()
    value = f.rng.choice([_truncated(f, role, topic, saga_id), f.random_bytes()])
    headers: Headers = (("message_id", b"\xff\xfe\xfd" + f.rng.randbytes(4)), ("message_id", b"second"),
                        ("saga_id", None), ("causation_id", None), ("saga_type", b"\xc3\x28"))
    return saga_id.encode(), value, headers


def _oversized_id(f: PoisonFactory, role: Role, topic: str) -> tuple[bytes | None, bytes | None, Headers]:
    """A saga id far too long to be one (no store can key on it), key and body agreeing."""
    saga_id = f"{f.run_id}-long-" + "".join(f.rng.choices("abcdefghijklmnopqrstuvwxyz0123456789",
                                                          k=OVERSIZED_ID_LENGTH))
    return saga_id.encode(), f.valid_value(role, topic, saga_id), f.message_id()


def _oversized_message_id(f: PoisonFactory, role: Role, topic: str) -> tuple[bytes | None, bytes | None, Headers]:
    """A message id header too long to be one, on an otherwise dead-letter-bound message."""
    saga_id = f.saga_id()
    message_id = "".join(f.rng.choices("abcdefghijklmnopqrstuvwxyz", k=OVERSIZED_ID_LENGTH))
    if role == "start":
        value = wire.encode_start(StartSaga(saga_id=saga_id, saga_type="cruise", tenant_id=None,
                                            input=f.trip_input(saga_id)))
    else:  # a cancel / result for a saga that does not exist
        value = f.valid_value(role, topic, saga_id)
    return saga_id.encode(), value, (("message_id", message_id.encode()),)


def _start(saga_type: str = "trip", input_of: Callable[[PoisonFactory, str], bytes] | None = None,
           saga_id_of: Callable[[PoisonFactory], str] | None = None) -> Callable[
        [PoisonFactory, Role, str], tuple[bytes | None, bytes | None, Headers]]:
    def build(f: PoisonFactory, role: Role, topic: str) -> tuple[bytes | None, bytes | None, Headers]:
        saga_id = saga_id_of(f) if saga_id_of else f.saga_id()
        saga_input = input_of(f, saga_id) if input_of else f.trip_input(saga_id)
        value = wire.encode_start(StartSaga(saga_id=saga_id, saga_type=saga_type, tenant_id=None, input=saga_input))
        return saga_id.encode(), value, f.message_id()

    return build


def _huge(size_of: Callable[[PoisonFactory], int]) -> Callable[
        [PoisonFactory, Role, str], tuple[bytes | None, bytes | None, Headers]]:
    def build(f: PoisonFactory, role: Role, topic: str) -> tuple[bytes | None, bytes | None, Headers]:
        saga_id = f.saga_id()
        headers = f.message_id()
        return saga_id.encode(), f.sized_garbage(size_of(f) - len(saga_id) - len(headers[0][1] or b"") - 64), headers

    return build


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
)}


def kinds() -> Iterator[str]:
    """Every kind name."""
    return iter(KINDS)
