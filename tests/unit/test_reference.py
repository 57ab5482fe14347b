"""docs/reference.md is what tests/reference.py writes from the code: it reads without building the site, and a
signature or docstring that changed changes it (run ``python -m tests.reference``)."""

from __future__ import annotations

from tests import reference


def test_the_reference_page_is_what_the_code_says() -> None:
    assert reference.PATH.read_text() == reference.render(), (
        "docs/reference.md is out of date: run `python -m tests.reference`")
