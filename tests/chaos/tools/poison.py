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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import fastavro

from saga_orchestrator.participants.trip import PARTICIPANTS
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.codec import HEADER_SIZE, MARKER
from saga_orchestrator.schemas.message_types import CancelSaga, CommandKind, ResultStatus, StartSaga, StepResult
from saga_orchestrator.schemas.registry import SchemaRegistry, default_registry
from saga_orchestrator.schemas.topics import Topics
from tests.chaos.tools.poison_kinds import KINDS, NEEDS_LARGE_TOPICS, ROLES, Headers, Kind, Role

__all__ = ["KINDS", "ROLES", "Headers", "Kind", "PoisonFactory", "PoisonRecord", "Role"]


TRIP_REQUEST = "saga.v1.trip.TripRequest"


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


@dataclass
class PoisonFactory:
    """Builds poison records for the topics of one prefix; deterministic for a given ``seed``."""

    topics: Topics
    participants: tuple[str, ...] = PARTICIPANTS
    seed: int = 0
    run_id: str = "poison"
    include_above_codec_limit: bool = False  # kinds that need topics taking records above 1 MiB
    registry: SchemaRegistry = field(default_factory=default_registry)

    def __post_init__(self) -> None:
        self.rng: random.Random = random.Random(self.seed)
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
                and (self.include_above_codec_limit or k.name not in NEEDS_LARGE_TOPICS)]

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
        from saga_orchestrator.schemas.event_types import SagaCompleted

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
