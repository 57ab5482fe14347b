"""Sizes and shapes every message of the contract keeps, checked where a message enters a service.

Ids become primary-key columns (a Postgres btree entry holds at most ~2.7 kB) and texts become ``text`` and
``jsonb`` values (neither can hold U+0000); values become Kafka records (1 MiB by default). A message that
breaks these limits is refused at the door with a reason; handled any later, its transaction would fail on
every redelivery and stall its partition.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MAX_VALUE_BYTES = 1024 * 1024
"""Largest encoded value a codec accepts (1 MiB, Kafka's default ``max.message.bytes`` order of size)."""

MAX_SAGA_ID_BYTES = 512
"""Longest saga id (UTF-8 bytes) a service accepts; derived ids (``{saga_id}:{step}:compensate``,
``...:reply:{attempt}``) add to it."""

MAX_MESSAGE_ID_BYTES = 1024
"""Longest ``message_id`` header (UTF-8 bytes): room for a reply id built on the longest saga id."""

MAX_START_SAGA_BYTES = MAX_VALUE_BYTES - 16 * 1024
"""Largest StartSaga accepted. Its SagaStarted event and its commands copy the input, add ids and headers,
and must still fit the codec's limit and a default Kafka record batch (1 MiB), or recording the saga would
fail on every redelivery."""

MAX_STEP_OUTPUT_BYTES = 256 * 1024
"""Largest output one step may give. The participant kit turns a larger one into the definitive failure
OUTPUT_TOO_LARGE and rolls the change back; one that reaches the orchestrator anyway is refused there
(OUTPUT_REFUSED). Outputs travel in later commands, so they must leave room for the saga input."""

MAX_STEP_OUTPUTS_BYTES = 512 * 1024
"""Most bytes of step outputs one command carries (``StepCommand.step_outputs``): an output that would take a
later command over it is refused like an oversize one."""

MAX_COMMAND_PAYLOAD_BYTES = MAX_START_SAGA_BYTES
"""Most bytes of saga input plus step outputs one command carries, with the same room for ids and framing a
StartSaga keeps."""

MAX_ERROR_MESSAGE_CHARS = 4_000
"""Longest error message a reply's failure keeps: longer ones are cut where they enter (kit and orchestrator),
as they are copied into events, reasons and dead letters."""

OUTPUT_TOO_LARGE = "OutputTooLarge"
"""error_type of a step whose handler gave an output over MAX_STEP_OUTPUT_BYTES: the participant kit rolled its
change back and answered a definitive failure, so there is nothing to undo."""

OUTPUT_REFUSED = "OutputRefused"
"""error_type the orchestrator records for a success whose output it cannot carry on (over
MAX_STEP_OUTPUT_BYTES, or a later command would break its budget): the step is failed for good, and as it took
effect, an unwinding saga compensates it."""

MAX_TEXT_CHARS = 4_000
"""Longest text a client or an operator gives a message (a cancel's reason, a release's operator and detail): it
goes into an event; a longer one is refused at the door."""

MAX_REJECTION_REASON_CHARS = 2_000
"""Longest reason a refused record is given: it quotes ids and decoder errors, and goes into an event and a
dead letter."""

DEAD_LETTER_MAX_BYTES = 1_000_000
"""Largest dead letter written: under Kafka's default 1 MiB record batch with room for the letter's key and
headers (ids, bounded) and the framing, so a letter always fits saga.dlq. A letter that names a Kafka
record nobody can publish would stop its outbox, and everything behind it, for good."""

MAX_DEAD_LETTER_REASON_CHARS = 4_000
"""Longest reason a dead letter keeps."""


def clip_text(text: str | None, limit: int = MAX_ERROR_MESSAGE_CHARS) -> str | None:
    """``text`` cut to ``limit`` characters (marked with "..."), None kept."""
    if text is None or len(text) <= limit:
        return text
    return text[:limit] + "..."


def id_problem(value: str, what: str, limit: int = MAX_SAGA_ID_BYTES) -> str | None:
    """Why ``value`` cannot serve as an identifier (too long, or a NUL), or None when it can.

    An empty id is left to the caller: some contexts allow one, some do not.
    """
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > limit:
        return f"{what} of {size} bytes is longer than the {limit} allowed"
    if "\x00" in value:
        return f"{what} contains a NUL character"
    return None


def usable_id(value: str | None, limit: int = MAX_SAGA_ID_BYTES) -> str | None:
    """``value`` when it can serve as an identifier, else None (for ids read from untrusted input)."""
    return value if value is not None and id_problem(value, "id", limit) is None else None


def nul_field(value: Any, path: str = "") -> str | None:
    """The path of the first text holding a NUL character in a decoded record (dicts, lists, dataclass
    fields given as a mapping), or None when there is none."""
    if isinstance(value, str):
        return (path or "value") if "\x00" in value else None
    if isinstance(value, Mapping):
        items: Any = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = nul_field(item, f"{path}.{key}" if path else str(key))
        if found:
            return found
    return None
