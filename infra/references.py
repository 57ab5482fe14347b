"""``module:attribute`` references to a user's own code (saga definitions, participants), loaded by name.

A reference names a module importable by the service: installed, on ``PYTHONPATH``, or in the working
directory. The working directory is searched last, after the installed packages, so a user's ``cli/`` or
``schemas.py`` never shadows a library, and a service finds the same code whichever way it was started
(``saga run all`` starts its children with ``python -P``, which leaves the working directory out).
"""

from __future__ import annotations

import importlib
import os
import sys


def load_reference(reference: str) -> object:
    """The object ``module:attribute`` names; ValueError says what is missing."""
    module_name, _, attribute = reference.strip().partition(":")
    if not module_name or not attribute:
        raise ValueError(f"{reference!r} is not of the form module:attribute")
    working_directory = os.getcwd()
    if working_directory not in sys.path and "" not in sys.path:
        sys.path.append(working_directory)
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"cannot import {module_name} for {reference!r}: {error}") from None
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ValueError(f"module {module_name} has no attribute {attribute}") from None


def load_references(references: str) -> dict[str, object]:
    """The objects a comma-separated list of ``module:attribute`` references names, by reference."""
    return {reference.strip(): load_reference(reference) for reference in references.split(",") if reference.strip()}
