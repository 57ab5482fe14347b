"""The refusal of a deployment whose settings cannot work.

Every process checks at start what it can (its definitions and participants load, their input records are in
SAGA_SCHEMA_PATH, the Kafka credentials work, the database belongs to this deployment, ...) and raises
``Misconfigured`` with one line that names the setting to fix. No retry changes such a setting, so the process
refuses to start (``saga run``: exit code 2) and the command line prints that line, never a traceback.
"""

from __future__ import annotations


class Misconfigured(ValueError):
    """A setting that cannot work; the message names it and says what is wrong, in one line."""
