"""Typed authoring: pydantic records as Avro, participants declared with decorators, sagas built from the action
objects, one app object; every mistake named where it is made."""

from __future__ import annotations

import datetime
import enum
import json
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import BaseModel

from saga_orchestrator.authoring import (
    UNLIMITED_RETRY,
    RetryPolicy,
    Saga,
    SagaApp,
    StepContext,
    StepFailed,
    participant,
)
from saga_orchestrator.infra.app import LoadedApp, app_reference, refuse_problems, stale_records
from saga_orchestrator.infra.misconfigured import Misconfigured
from saga_orchestrator.orchestrator.domain.errors import DefinitionError
from saga_orchestrator.participants.kit.outcome import Failed
from saga_orchestrator.schemas.evolution import compatibility_problems
from saga_orchestrator.schemas.registry import SchemaRegistry, load_tree
from saga_orchestrator.schemas.typed import OUTPUTS_FOLDER, Record, from_avro, schema_files, to_avro


class Size(enum.Enum):
    SMALL = "S"
    LARGE = "L"


class Address(BaseModel):
    street: str
    zip_code: str | None = None


class Parcel(BaseModel):
    parcel_id: str
    size: Size = Size.SMALL
    to: Address
    weight_grams: int
    sent_at: datetime.datetime
    tags: list[str] = []


class Label(BaseModel):
    to: Address
    code: str


class Pickup(BaseModel):
    slot: int


# -- records ------------------------------------------------------------------------------------------------------

def test_a_model_is_an_avro_record_of_its_namespace() -> None:
    schema = Record(Parcel, "shop.v1").schema()
    assert (schema["type"], schema["name"], schema["namespace"]) == ("record", "Parcel", "shop.v1")
    fields = {field["name"]: field for field in schema["fields"]}
    assert fields["weight_grams"]["type"] == "long"
    assert fields["sent_at"]["type"] == {"type": "long", "logicalType": "timestamp-millis"}
    assert fields["to"]["type"]["name"] == "Address"
    assert fields["size"]["default"] == "S" and fields["tags"]["default"] == []
    assert "doc" not in json.dumps(schema)


def test_a_value_goes_through_its_record_and_back(tmp_path: Path) -> None:
    registry = _registry(tmp_path, [Record(Parcel, "shop.v1"), Record(Label, "shop.v1", OUTPUTS_FOLDER)])
    parcel = Parcel(parcel_id="p-1", size=Size.LARGE, to=Address(street="1 Main St"), weight_grams=2_000,
                    sent_at=datetime.datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=datetime.UTC), tags=["fragile"])
    name, record = registry.decode(registry.encode("shop.v1.Parcel", to_avro(parcel)))
    assert name == "shop.v1.Parcel" and from_avro(Parcel, record) == parcel


def test_a_type_nested_in_two_records_is_defined_once_in_the_folder(tmp_path: Path) -> None:
    files = schema_files([Record(Label, "shop.v1", OUTPUTS_FOLDER), Record(Parcel, "shop.v1")])
    assert list(files) == ["inputs/shop.v1.Parcel.avsc", "outputs/shop.v1.Label.avsc"]
    label_fields = {field["name"]: field["type"] for field in files["outputs/shop.v1.Label.avsc"]["fields"]}
    assert label_fields["to"] == "shop.v1.Address"  # defined in Parcel's file, referred to here
    assert set(load_tree(_written(tmp_path, files))) == {"shop.v1.Parcel", "shop.v1.Label"}


def test_one_model_given_by_two_participants_is_a_record_and_a_file_in_each_namespace() -> None:
    files = schema_files([Record(Label, "saga.v1.post", OUTPUTS_FOLDER),
                          Record(Label, "saga.v1.courier", OUTPUTS_FOLDER)])
    assert list(files) == ["outputs/saga.v1.courier.Label.avsc", "outputs/saga.v1.post.Label.avsc"]
    assert {schema["namespace"] for schema in files.values()} == {"saga.v1.courier", "saga.v1.post"}


def test_a_field_added_with_a_default_stays_compatible_and_one_without_does_not() -> None:
    class Parcel2(Parcel):
        insured: bool = False

    class Parcel3(Parcel):
        insured: bool

    released = Record(Parcel, "shop.v1").schema()
    with_default = dict(Record(Parcel2, "shop.v1").schema(), name="Parcel")
    without = dict(Record(Parcel3, "shop.v1").schema(), name="Parcel")
    assert compatibility_problems("shop.v1.Parcel", with_default, released, "1.0") == []
    assert compatibility_problems("shop.v1.Parcel", without, released, "1.0")


# -- participants ---------------------------------------------------------------------------------------------------

shop = participant("shop", tables=["CREATE TABLE IF NOT EXISTS shop.parcels (id text PRIMARY KEY)"])
courier = participant("courier")


@shop.action
async def pack(step: StepContext, parcel: Parcel) -> Label:
    return Label(to=parcel.to, code=step.idempotency_key)


@pack.undo
async def unpack(step: StepContext, parcel: Parcel, label: Label) -> None:
    return None


@courier.action(name="book_pickup")
async def book(step: StepContext, parcel: Parcel, label: Label) -> Pickup:
    if parcel.weight_grams > 30_000:
        raise StepFailed("TooHeavy", "over 30 kg")
    return Pickup(slot=1)


@courier.action
async def notify(step: StepContext, parcel: Parcel, pickup: Pickup | None) -> Failed | None:
    return None


def test_an_action_is_named_after_its_function_and_knows_what_it_reads_and_gives() -> None:
    assert (pack.name, pack.participant_name, pack.undo_name) == ("pack", "shop", "unpack")
    assert pack.input_model is Parcel and pack.output_model is Label and pack.needs == {}
    assert (book.name, book.output_model) == ("book_pickup", Pickup)
    assert {name: (need.model, need.optional) for name, need in notify.needs.items()} == {"pickup": (Pickup, True)}
    assert unpack.compensates is pack and unpack.needs["label"].model is Label
    assert pack.output_record == Record(Label, "saga.v1.shop", OUTPUTS_FOLDER)


def test_the_declaration_builds_the_kits_participant() -> None:
    built = shop.build(input_types=frozenset({"saga.v1.parcel.Parcel"}))
    assert (built.name, built.schema, set(built.handlers)) == ("shop", "shop", {"pack", "unpack"})
    assert built.business_ddl == ("CREATE TABLE IF NOT EXISTS shop.parcels (id text PRIMARY KEY)",)
    assert built.input_types == frozenset({"saga.v1.parcel.Parcel"})


@pytest.mark.parametrize(("handler", "message"), [
    ("async def f(step): ...", "takes the step context and the saga input"),
    ("async def f(step: StepContext, parcel: dict) -> None: ...", "second parameter with the saga input's pydantic"),
    ("async def f(step: StepContext, parcel: Parcel, extra: int) -> None: ...", "parameter 'extra' with the pydantic"),
    ("async def f(step: StepContext, parcel: Parcel) -> Label | Pickup: ...", "return one pydantic model"),
    ("async def f(step: StepContext, parcel: Parcel) -> int: ...", "return one pydantic model"),
])
def test_a_handler_that_cannot_be_read_is_refused_with_what_to_write(handler: str, message: str) -> None:
    namespace: dict[str, object] = {"StepContext": StepContext, "Parcel": Parcel, "Label": Label, "Pickup": Pickup}
    exec(handler, namespace)  # a handler written the way a team would, in a module
    with pytest.raises(TypeError, match=message):
        participant("x").action(namespace["f"])  # type: ignore[call-overload]


def test_an_action_declared_twice_is_refused() -> None:
    twice = participant("twice")
    twice.action(pack.handler)
    with pytest.raises(ValueError, match="already has an action 'pack'"):
        twice.action(pack.handler)


# -- sagas ----------------------------------------------------------------------------------------------------------

def _saga() -> Saga:
    saga = Saga("parcel", input=Parcel, deadline=timedelta(hours=48))
    packed = saga.step(pack, timeout=timedelta(seconds=2))
    booked = saga.step(book, after=[packed], pivot=True)
    saga.step(notify, after=[booked])
    return saga


def test_a_saga_is_built_from_the_action_objects_each_name_written_once() -> None:
    definition = _saga().definition
    assert definition.input_schema == "saga.v1.parcel.Parcel" and definition.deadline_ms == 48 * 3_600_000
    assert [(s.name, s.participant, s.command, s.compensation, s.depends_on) for s in definition.steps] == [
        ("pack", "shop", "pack", "unpack", ()),
        ("book_pickup", "courier", "book_pickup", None, ("pack",)),
        ("notify", "courier", "notify", None, ("book_pickup",)),
    ]
    assert definition.step("pack").timeout_ms == 2_000 and definition.step("book_pickup").pivot


def test_a_step_after_the_pivot_retries_without_limit_unless_told_otherwise() -> None:
    definition = _saga().definition
    assert definition.step("pack").retry == RetryPolicy()
    assert definition.step("notify").retry == UNLIMITED_RETRY


def test_a_step_that_needs_an_output_no_step_before_it_gives_is_refused() -> None:
    saga = Saga("parcel", input=Parcel)
    saga.step(book)  # needs the Label pack gives, and pack is not before it
    with pytest.raises(DefinitionError, match="book_pickup takes label: Label, which no step before it gives"):
        _ = saga.definition


def test_a_saga_lists_its_records() -> None:
    assert {record.full_name for record in _saga().records()} == {
        "saga.v1.parcel.Parcel", "saga.v1.shop.Label", "saga.v1.courier.Pickup"}


# -- the app ----------------------------------------------------------------------------------------------------------

def test_the_app_names_a_participant_nobody_serves_and_an_action_its_participant_lacks() -> None:
    other = participant("courier")
    other.action(name="something_else")(book.handler)
    app = SagaApp(sagas=[_saga()], participants=[participant("shop")])
    assert app.problems()[0].startswith("saga parcel (version 1) step pack names action pack of participant shop, "
                                        "which has no such action")
    assert any("sends to participant courier, which no participant of the app serves" in p for p in app.problems())
    app = SagaApp(sagas=[_saga()], participants=[shop, other])
    assert any("names action book_pickup of participant courier" in problem for problem in app.problems())
    with pytest.raises(Misconfigured, match="SAGA_APP='x:app': saga parcel"):
        refuse_problems(LoadedApp(app, "x:app", "SAGA_APP"))


def test_a_participant_built_by_the_app_reads_the_inputs_of_the_sagas_that_use_it() -> None:
    app = SagaApp(sagas=[_saga()], participants=[shop, courier])
    assert app.participant("courier").input_types == frozenset({"saga.v1.parcel.Parcel"})
    assert app.problems() == []


def test_stale_records_are_named_until_they_are_written(tmp_path: Path) -> None:
    app = SagaApp(sagas=[_saga()], participants=[shop, courier], schema_folder=tmp_path)
    loaded = LoadedApp(app, "x:app", "SAGA_APP")
    assert len(stale_records(loaded)) == 3
    with pytest.raises(Misconfigured, match="run `saga schemas write`"):
        refuse_problems(loaded)
    _written(tmp_path, schema_files(app.records()))
    assert stale_records(loaded) == []
    refuse_problems(loaded)


def test_the_app_is_named_by_the_setting_or_by_pyproject(tmp_path: Path) -> None:
    assert app_reference("shop.saga:app", tmp_path) == ("shop.saga:app", "SAGA_APP")
    assert app_reference(None, tmp_path) is None
    (tmp_path / "pyproject.toml").write_text('[tool.saga]\napp = "shop.saga:app"\n')
    reference, named_by = app_reference(None, tmp_path) or ("", "")
    assert reference == "shop.saga:app" and named_by.startswith("[tool.saga] app")
    (tmp_path / "pyproject.toml").write_text('[tool.saga]\napp = 3\n')
    with pytest.raises(Misconfigured, match="must be a module:attribute string"):
        app_reference(None, tmp_path)


def _written(folder: Path, files: dict[str, dict[str, object]]) -> Path:
    for name, schema in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(json.dumps(schema))
    return folder


def _registry(folder: Path, records: list[Record]) -> SchemaRegistry:
    typed = load_tree(_written(folder, schema_files(records)))
    return SchemaRegistry([*SchemaRegistry.from_directory().current_schemas(), *typed.values()])
