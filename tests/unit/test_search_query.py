"""A search box's text read as a search: a saga id, a value's start, or one field's (operations.search)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from saga_orchestrator.operations.ports import SagaSearch
from saga_orchestrator.operations.search import parse, searchable_fields
from saga_orchestrator.participants.trip.definition import TRIP

FIELDS = {"customer_id", "email", "a"}


@pytest.mark.parametrize(("text", "field", "value"), [
    ("acme-42", "", "acme-42"),
    ("  ACME  ", "", "ACME"),
    ("customer_id=acme-42", "customer_id", "acme-42"),
    ("customer_id = acme-42 ", "customer_id", "acme-42"),
    ("a=b=c", "a", "b=c"),  # a field: the rest, '=' and all, is its value
    ("x=b=c", "", "x=b=c"),  # not a field: the whole text is a value
    ("Email=x@example.com", "", "Email=x@example.com"),  # field names are as declared
    ("email=", "", "email="),  # nothing to look for in the field: a value
    ("=acme", "", "=acme"),
])
def test_the_text_names_a_field_only_when_one_is_searchable(text: str, field: str, value: str) -> None:
    assert parse(text, FIELDS) == SagaSearch(saga_id=text.strip(), value=value, field=field)


def test_the_whole_text_is_still_a_saga_id_and_the_filters_pass_through() -> None:
    found = parse(" a=trip/7 ", FIELDS, tenant="t1", started_after_ms=1, started_before_ms=2)
    assert found == SagaSearch(saga_id="a=trip/7", value="trip/7", field="a", tenant="t1", started_after_ms=1,
                               started_before_ms=2)
    assert parse("x", FIELDS, tenant="") == SagaSearch(saga_id="x", value="x")  # a blank tenant: any


@pytest.mark.parametrize("text", ["", "   "])
def test_a_blank_text_searches_nothing(text: str) -> None:
    assert parse(text, FIELDS, tenant="t1") is None


def test_the_searchable_fields_of_every_deployed_version_newest_first() -> None:
    v1 = replace(TRIP, version=1, searchable=("email", "customer_id"))
    v2 = replace(TRIP, version=2, searchable=("customer_id", "booking_ref"))
    plain = replace(TRIP, saga_type="refund", searchable=())
    assert searchable_fields([v1, plain, v2]) == {"trip": ("customer_id", "booking_ref", "email")}
