"""The replay check of ``saga definitions check``, end to end, on N stored mid-flight trip histories.

    python -m bench.replay_check [--sagas 1000 100000] [--processes 2]

Trips are driven through the pure core (``testing.history.SagaRun``) to where running trips wait: on both
bookings, on the hotel, on a retry of the hotel, on the charge, on the itinerary, turning back; each history is
copied under N saga ids and encoded as the event store keeps events. Timed: decoding, folding on the deployed
trip and on a candidate (``bench.trip_changes:PATIENT``, a policy change), and every probe of both, split
over ``--processes`` worker processes. Prints histories/s per N.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import time
from collections.abc import Sequence
from typing import Any

from bench.trip_changes import PATIENT
from saga_orchestrator.cli.definitions_check_cmd import check_encoded
from saga_orchestrator.orchestrator.domain.definition import DefinitionRegistry
from saga_orchestrator.orchestrator.domain.replay_check import Outcome
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.schemas import event_types as ev
from saga_orchestrator.schemas import wire
from saga_orchestrator.testing.history import SagaRun

Stored = tuple[str, list[bytes]]


def templates() -> list[list[ev.Event]]:
    """One history of each place a running trip waits."""
    found = []
    for path in ([], ["ok:book_flight"], ["fail:book_hotel"], ["ok:book_flight", "ok:book_hotel"],
                 ["ok:book_flight", "ok:book_hotel", "ok:charge_card"], ["ok:book_flight", "stop:book_hotel"]):
        run = SagaRun(TRIP, saga_id="template")
        run.start()
        for move in path:
            what, step = move.split(":")
            if what == "ok":
                run.ok(step)
            elif what == "fail":
                run.fail(step, "Unavailable", retryable=True)
            else:
                run.fail(step, "NoRooms")
        found.append(run.events)
    return found


def _renamed(event: ev.Event, saga_id: str) -> ev.Event:
    changes: dict[str, Any] = {field.name: value.replace("template", saga_id) for field in dataclasses.fields(event)
               if isinstance(value := getattr(event, field.name), str) and "template" in value}
    return dataclasses.replace(event, **changes)


def stored_histories(count: int) -> list[Stored]:
    """``count`` encoded mid-flight histories, the templates in turn."""
    shapes = templates()
    return [(saga_id, [wire.encode_event(_renamed(event, saga_id)) for event in shapes[number % len(shapes)]])
            for number in range(count) for saga_id in [f"trip-{number:07d}"]]


def _check_chunk(chunk: Sequence[Stored]) -> dict[str, int]:
    verdicts = check_encoded(DefinitionRegistry([TRIP]), DefinitionRegistry([PATIENT]), chunk)
    counts: dict[str, int] = {}
    for verdict in verdicts:
        counts[verdict.outcome.name] = counts.get(verdict.outcome.name, 0) + 1
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sagas", type=int, nargs="+", default=[1_000, 100_000])
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    for count in args.sagas:
        histories = stored_histories(count)
        events = sum(len(bodies) for _, bodies in histories)
        size = max(1, len(histories) // (args.processes * 8))
        chunks = [histories[i:i + size] for i in range(0, len(histories), size)]
        with multiprocessing.get_context("fork").Pool(args.processes) as pool:
            pool.map(_check_chunk, [chunks[0][:10]] * args.processes)  # warm every worker's imports and caches
            start = time.perf_counter()
            results = pool.map(_check_chunk, chunks)
            elapsed = time.perf_counter() - start
        totals: dict[str, int] = {}
        for counts in results:
            for name, value in counts.items():
                totals[name] = totals.get(name, 0) + value
        assert totals == {Outcome.SAME.name: count}, totals
        print(f"{count:>9,} histories ({events:,} events), {args.processes} processes: {elapsed:6.2f} s, "
              f"{count / elapsed:>9,.0f} histories/s")


if __name__ == "__main__":
    main()
