"""How many of the project's files one StartSaga's decide-and-write passes through in the orchestrator.

What is measured: the distinct source files of the ``saga_orchestrator`` package in which a Python function is
entered (``sys.setprofile`` "call" events, generators and coroutines resumed included) while the orchestrator
takes one StartSaga record of the reference trip:

1. the record is parsed at the door (``RecordParser.parse``: decoded, checked, keyed for the inbox), then
2. the service handles it (``SagaService.handle``: the isolation ladder, the unit of work, inbox claim, load,
   fold, decide, the event, command, timer and outbox rows) until the unit of work has committed.

The store is the in-memory adapter (``orchestrator.store.memory``, counted like any other file), the clock is a
constant and tracing is off. One saga is handled first and not counted, so what is counted is the steady path
of a warm process: modules loaded at import, caches filled, nothing imported on the call. Files of the standard
library and third parties (the Avro codec's library, OpenTelemetry's no-op tracer) are not counted; the
project's ``schemas`` package, which the orchestrator calls for every encode and decode, is.

Run: ``.venv/bin/python bench/decision_path.py [--list]``. Prints the count (and, with ``--list``, the files,
with how many calls entered each).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

from saga_orchestrator.orchestrator.domain.definition import DefinitionRegistry
from saga_orchestrator.orchestrator.inbound import RecordParser
from saga_orchestrator.orchestrator.service import Outcome, SagaService
from saga_orchestrator.orchestrator.store.memory import MemoryStore
from saga_orchestrator.participants.trip import PARTICIPANTS, TRIP
from saga_orchestrator.participants.trip.scenarios import SCENARIOS
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.records import ConsumedRecord
from saga_orchestrator.schemas.registry import default_registry
from saga_orchestrator.schemas.topics import Topics

PACKAGE_ROOT = Path(sys.modules["saga_orchestrator.schemas"].__file__ or "").resolve().parent.parent
"""The folder ``saga_orchestrator`` maps to (the repository root): a file under it is one of the project's."""
NOW_MS = 1_700_000_000_000


def _start_record(saga_id: str, offset: int, topics: Topics) -> ConsumedRecord:
    value = wire.encode_start(SCENARIOS["happy"].start(saga_id))
    return ConsumedRecord(topic=topics.start, partition=0, offset=offset, key=saga_id.encode(), value=value,
                          headers=(("message_id", f"start-{saga_id}".encode()),))


def _project_file(filename: str) -> str | None:
    """``filename`` relative to the package root when it is one of the project's files (not bench/, not tests/)."""
    if not filename.endswith(".py"):  # "<string>" (a dataclass's generated __init__), "<frozen os>"...
        return None
    try:
        relative = Path(filename).resolve().relative_to(PACKAGE_ROOT)
    except ValueError:
        return None
    if relative.parts[0] in ("bench", "tests", ".venv"):
        return None
    return str(relative)


async def measure() -> tuple[Counter[str], Counter[str]]:
    """Calls entered per project file while one warm StartSaga is parsed, then handled until its unit of work
    committed."""
    topics = Topics()
    parser = RecordParser(topics, DefinitionRegistry([TRIP]), default_registry(), PARTICIPANTS)
    service = SagaService(MemoryStore(), DefinitionRegistry([TRIP]), topics, lambda: NOW_MS)
    assert await service.handle(parser.parse(_start_record("warm-up", 0, topics))) is Outcome.APPLIED
    record = _start_record("measured", 1, topics)
    parsed: Counter[str] = Counter()
    handled: Counter[str] = Counter()
    entered = parsed
    names: dict[str, str | None] = {}

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call":
            return
        filename = frame.f_code.co_filename
        if filename not in names:
            names[filename] = _project_file(filename)
        name = names[filename]
        if name is not None:
            entered[name] += 1

    sys.setprofile(profile)
    try:
        envelope = parser.parse(record)
        entered = handled
        outcome = await service.handle(envelope)
    finally:
        sys.setprofile(None)
    assert outcome is Outcome.APPLIED, outcome
    return parsed, handled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--list", action="store_true", help="print the files and the calls entered in each")
    args = parser.parse_args()
    parsed, handled = asyncio.run(measure())
    both = parsed + handled
    print(f"decide-and-write of one StartSaga: {len(both)} files, {both.total()} calls "
          f"(parse {len(parsed)} files, handle {len(handled)} files)")
    if args.list:
        for name, calls in sorted(both.items()):
            where = "+".join(part for part, counter in (("parse", parsed), ("handle", handled)) if name in counter)
            print(f"  {name:40} {calls:4} calls  {where}")


if __name__ == "__main__":
    main()
