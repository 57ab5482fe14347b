"""Single-object codec and schema registry: fingerprints, round trips, interoperability, errors."""

from __future__ import annotations

import io
import json
import os
from typing import Any

import avro.errors
import avro.io
import avro.name
import avro.schema
import fastavro.utils
import pytest
from hypothesis import given
from hypothesis import strategies as st

from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.codec import (
    HEADER_SIZE,
    MARKER,
    InvalidRecord,
    MalformedBody,
    NotSingleObject,
    UnknownFingerprint,
    UnknownSchemaName,
    ValueTooLarge,
    WireError,
    WrongSchema,
    fingerprint_of,
    split_header,
)
from saga_orchestrator.schemas.message_types import CommandKind, ResultStatus, StartSaga, StepResult
from saga_orchestrator.schemas.registry import (
    DEFAULT_SCHEMA_PATH,
    SCHEMAS_DIR,
    SchemaRegistry,
    default_registry,
    schema_folders,
)

REGISTRY = default_registry()
ALL_NAMES = REGISTRY.names()
# The contract's schema files and those of the trip example (SAGA_SCHEMA_PATH's default), released ones apart.
SCHEMA_FILES = sorted(path for folder in (SCHEMAS_DIR, *schema_folders(DEFAULT_SCHEMA_PATH))
                      for path in folder.rglob("*.avsc") if "released" not in path.parts)
START = "saga.v1.StartSaga"


def avro_schemas_from_files() -> dict[str, avro.schema.Schema]:
    """Parse the raw .avsc files with the reference library alone, resolving names across files the
    way any Avro client would: one shared name table, a file retried once its dependencies are in."""
    names = avro.name.Names()
    pending = list(SCHEMA_FILES)
    parsed: dict[str, avro.schema.Schema] = {}
    while pending:
        progress = False
        for path in list(pending):
            trial = avro.name.Names()
            trial.names = dict(names.names)
            try:
                schema = avro.schema.make_avsc_object(json.loads(path.read_text()), trial)
            except avro.errors.SchemaParseException:
                continue
            names, progress = trial, True
            pending.remove(path)
            assert isinstance(schema, avro.schema.NamedSchema)
            parsed[schema.fullname] = schema
        assert progress, f"unresolvable schema files: {pending}"
    return parsed


AVRO_SCHEMAS = avro_schemas_from_files()


def avro_body(schema: avro.schema.Schema, record: Any) -> bytes:
    buffer = io.BytesIO()
    avro.io.DatumWriter(schema).write(record, avro.io.BinaryEncoder(buffer))
    return buffer.getvalue()


def avro_read(schema: avro.schema.Schema, body: bytes) -> Any:
    return avro.io.DatumReader(schema).read(avro.io.BinaryDecoder(io.BytesIO(body)))


# --- fingerprints ---------------------------------------------------------------------------------------


def test_fingerprints_match_the_spec_test_vectors() -> None:
    # Avro's own schema fingerprint test data: "null" and "int" (CRC-64-AVRO, as unsigned integers), carried
    # little-endian in the single-object header.
    assert fingerprint_of('"null"') == (7195948357588979594).to_bytes(8, "little")
    assert fingerprint_of('"int"') == (8247732601305521295).to_bytes(8, "little")
    assert fingerprint_of('"int"') == bytes.fromhex("8f5c393f1ad57572")


@pytest.mark.parametrize(
    "primitive", ["null", "boolean", "int", "long", "float", "double", "bytes", "string"]
)
def test_fingerprints_match_the_reference_library_on_primitives(primitive: str) -> None:
    expected = avro.schema.parse(json.dumps(primitive)).fingerprint("CRC-64-AVRO")
    assert fingerprint_of(json.dumps(primitive)) == expected


def test_registry_holds_every_current_schema_file_and_no_released_one() -> None:
    assert len(ALL_NAMES) == len(SCHEMA_FILES) == len(AVRO_SCHEMAS) == 52
    assert set(ALL_NAMES) == set(AVRO_SCHEMAS)
    assert REGISTRY.names("inputs") == ["saga.v1.trip.TripRequest"]


@pytest.mark.parametrize("name", ALL_NAMES)
def test_fingerprint_equals_the_reference_library(name: str) -> None:
    reference = AVRO_SCHEMAS[name]
    assert REGISTRY.fingerprint(name) == reference.fingerprint("CRC-64-AVRO")
    assert REGISTRY.schema(name).canonical_form == reference.canonical_form


def test_a_schema_using_a_type_from_another_file_is_fingerprinted_with_its_full_definition() -> None:
    canonical = REGISTRY.schema("saga.v1.StepResult").canonical_form
    assert '{"name":"saga.v1.CommandKind","type":"enum","symbols":["FORWARD","COMPENSATE"]}' in canonical


# --- round trips and interoperability -------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL_NAMES)
def test_every_schema_round_trips(name: str) -> None:
    for record in fastavro.utils.generate_many(REGISTRY.schema(name).schema, 5):
        data = REGISTRY.encode(name, record)
        assert data[:HEADER_SIZE] == MARKER + REGISTRY.fingerprint(name)
        assert REGISTRY.decode(data) == (name, record)
        assert REGISTRY.decode_as(data, name) == (name, record)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_our_values_decode_with_the_reference_library(name: str) -> None:
    for record in fastavro.utils.generate_many(REGISTRY.schema(name).schema, 5):
        data = REGISTRY.encode(name, record)
        assert avro_read(AVRO_SCHEMAS[name], data[HEADER_SIZE:]) == record


@pytest.mark.parametrize("name", ALL_NAMES)
def test_reference_library_values_decode_with_our_registry(name: str) -> None:
    schema = AVRO_SCHEMAS[name]
    for record in fastavro.utils.generate_many(REGISTRY.schema(name).schema, 5):
        data = MARKER + schema.fingerprint("CRC-64-AVRO") + avro_body(schema, record)
        assert REGISTRY.decode(data) == (name, record)


def test_a_start_saga_written_by_the_reference_library_is_a_typed_start_saga() -> None:
    schema = AVRO_SCHEMAS[START]
    record: dict[str, Any] = {"saga_id": "trip-1", "saga_type": "trip", "tenant_id": None, "input": b"\x01"}
    data = MARKER + schema.fingerprint("CRC-64-AVRO") + avro_body(schema, record)
    assert wire.decode_start(data) == StartSaga(**record)


_text = st.text(max_size=40)
_int = st.integers(min_value=-(2**31), max_value=2**31 - 1)
_start_sagas = st.builds(
    StartSaga, saga_id=_text, saga_type=_text, tenant_id=st.none() | _text, input=st.binary(max_size=200),
    definition_version=st.none() | _int
)
_step_results = st.builds(
    StepResult,
    saga_id=_text,
    step=_text,
    kind=st.sampled_from(CommandKind),
    idempotency_key=_text,
    attempt=_int,
    status=st.sampled_from(ResultStatus),
    retryable=st.booleans(),
    error_type=st.none() | _text,
    error_message=st.none() | _text,
    output=st.none() | st.binary(max_size=200),
)


@given(_start_sagas)
def test_start_saga_round_trips(message: StartSaga) -> None:
    data = wire.encode_start(message)
    assert wire.decode_start(data) == message
    # A start naming no version is written with the oldest released schema that holds it (which Apache Avro
    # reads by that schema); one naming a version, with the current one.
    writer = next(s for s in [*REGISTRY.released_schemas(), *REGISTRY.current_schemas()]
                  if s.full_name == START and s.fingerprint == split_header(data))
    assert (writer.path.parts[0] == "commands") and ((message.definition_version is None) == (
        writer.fingerprint != REGISTRY.fingerprint(START)))
    record = avro_read(avro.schema.parse(json.dumps(writer.schema)), data[HEADER_SIZE:])
    expected: dict[str, Any] = {"saga_id": message.saga_id, "saga_type": message.saga_type,
                                "tenant_id": message.tenant_id, "input": message.input}
    if message.definition_version is not None:
        expected["definition_version"] = message.definition_version
    assert record == expected


@given(_step_results)
def test_step_result_round_trips(result: StepResult) -> None:
    decoded = wire.decode_result(wire.encode_result(result))
    assert decoded == result
    assert type(decoded.kind) is CommandKind and type(decoded.status) is ResultStatus


# --- errors ---------------------------------------------------------------------------------------------

_VALID = wire.encode_start(StartSaga(saga_id="s-1", saga_type="trip", tenant_id="t", input=b"abc"))


@pytest.mark.parametrize("data", [b"", b"\xc3", b"\xc3\x01\x00", b"\x00\x01" + bytes(20), b"hello world!"])
def test_bytes_without_marker_and_fingerprint_are_not_single_object(data: bytes) -> None:
    with pytest.raises(NotSingleObject, match="not an Avro single-object value"):
        REGISTRY.decode(data)


def test_random_bytes_are_rejected() -> None:
    for _ in range(200):
        with pytest.raises(WireError):
            REGISTRY.decode(os.urandom(64))


@given(st.binary(max_size=64))
def test_any_body_after_a_valid_header_decodes_or_raises_a_wire_error(body: bytes) -> None:
    try:
        REGISTRY.decode(_VALID[:HEADER_SIZE] + body)
    except WireError:
        pass


def test_unknown_fingerprint_names_the_fingerprint() -> None:
    data = MARKER + bytes.fromhex("0102030405060708") + b"\x00"
    with pytest.raises(UnknownFingerprint, match="0102030405060708"):
        REGISTRY.decode(data)


@pytest.mark.parametrize("cut", range(HEADER_SIZE, len(_VALID)))
def test_a_truncated_body_is_malformed(cut: int) -> None:
    with pytest.raises(MalformedBody):
        REGISTRY.decode(_VALID[:cut])


def test_trailing_bytes_are_malformed() -> None:
    with pytest.raises(MalformedBody, match="2 trailing bytes"):
        REGISTRY.decode(_VALID + b"\x00\x00")


def test_a_value_of_another_schema_is_the_wrong_schema() -> None:
    with pytest.raises(WrongSchema, match=r"saga\.v1\.StartSaga, expected saga\.v1\.CancelSaga"):
        REGISTRY.decode_as(_VALID, "saga.v1.CancelSaga")
    with pytest.raises(WrongSchema):
        REGISTRY.decode_as(_VALID, {"saga.v1.CancelSaga", "saga.v1.StepResult"})
    with pytest.raises(WrongSchema):
        wire.decode_event(_VALID)
    assert REGISTRY.decode_as(_VALID, [START, "saga.v1.CancelSaga"])[0] == START


def test_an_oversized_value_is_rejected_with_its_size_and_the_limit() -> None:
    small = SchemaRegistry.from_directory(max_value_size=100)
    huge_input = {"saga_id": "s", "saga_type": "trip", "tenant_id": None, "input": bytes(200)}
    with pytest.raises(ValueTooLarge, match="exceeds the limit of 100 bytes"):
        small.encode(START, huge_input)
    with pytest.raises(ValueTooLarge, match="value of 2097165 bytes"):
        REGISTRY.decode(
            REGISTRY.encode(START, {**huge_input, "input": bytes(1024)})[:10] + bytes(2 * 2**20 + 3)
        )


def test_a_record_that_does_not_fit_its_schema_is_invalid() -> None:
    good = {"saga_id": "s", "reason": "r"}
    with pytest.raises(InvalidRecord, match=r"saga\.v1\.CancelSaga"):
        REGISTRY.encode("saga.v1.CancelSaga", {**good, "extra": 1})
    with pytest.raises(InvalidRecord):
        REGISTRY.encode("saga.v1.CancelSaga", {"saga_id": "s"})
    with pytest.raises(InvalidRecord):
        REGISTRY.encode("saga.v1.CancelSaga", {**good, "reason": 5})
    with pytest.raises(UnknownSchemaName):
        REGISTRY.encode("saga.v1.Nope", good)
    with pytest.raises(UnknownSchemaName):
        REGISTRY.fingerprint("saga.v1.Nope")


def test_wire_errors_are_value_errors_with_a_reason() -> None:
    with pytest.raises(ValueError) as caught:
        REGISTRY.decode(b"xx")
    assert isinstance(caught.value, WireError) and caught.value.reason == str(caught.value)
