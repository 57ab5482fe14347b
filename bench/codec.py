"""Micro benchmark of the wire codec: encode/decode operations per second, raw and through the adapter.

Run: ``.venv/bin/python bench/codec.py [--seconds 1.0]``. Prints one line per case; numbers only.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.event_types import StepCommandSent
from saga_orchestrator.schemas.message_types import CommandKind, ResultStatus, StepResult
from saga_orchestrator.schemas.registry import default_registry

RESULT = StepResult(
    saga_id="trip-000042",
    step="book_hotel",
    kind=CommandKind.FORWARD,
    idempotency_key="trip-000042:book_hotel",
    attempt=1,
    status=ResultStatus.SUCCEEDED,
    output=b'{"reservation":"H-981273"}',
)
EVENT = StepCommandSent(
    saga_id="trip-000042",
    seq=3,
    definition_version=1,
    occurred_at=1_700_000_000_000,
    step="book_hotel",
    attempt=1,
    idempotency_key="trip-000042:book_hotel",
    message_id="trip-000042:command:3",
    timeout_at=1_700_000_030_000,
)


def ops_per_second(operation: Callable[[], object], seconds: float) -> float:
    """Run ``operation`` in batches until ``seconds`` have passed; return the rate."""
    for _ in range(1000):  # warm caches before timing
        operation()
    count, batch = 0, 1000
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        for _ in range(batch):
            operation()
        count += batch
    return count / elapsed


def main() -> None:
    """Print encode/decode ops/s for a StepResult and a StepCommandSent event."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=1.0, help="time per case")
    seconds = parser.parse_args().seconds

    registry = default_registry()
    result_bytes = wire.encode_result(RESULT)
    event_bytes = wire.encode_event(EVENT)
    _, result_record = registry.decode(result_bytes)
    _, event_record = registry.decode(event_bytes)
    cases: list[tuple[str, Callable[[], object]]] = [
        ("registry.encode StepResult", lambda: registry.encode("saga.v1.StepResult", result_record)),
        ("registry.decode StepResult", lambda: registry.decode(result_bytes)),
        ("wire.encode_result", lambda: wire.encode_result(RESULT)),
        ("wire.decode_result", lambda: wire.decode_result(result_bytes)),
        (
            "registry.encode StepCommandSent",
            lambda: registry.encode(wire.event_schema_name(EVENT), event_record),
        ),
        ("registry.decode StepCommandSent", lambda: registry.decode(event_bytes)),
        ("wire.encode_event StepCommandSent", lambda: wire.encode_event(EVENT)),
        ("wire.decode_event StepCommandSent", lambda: wire.decode_event(event_bytes)),
    ]
    print(f"value sizes: StepResult {len(result_bytes)} B, StepCommandSent {len(event_bytes)} B")
    for label, operation in cases:
        print(f"{label:<36} {ops_per_second(operation, seconds):>12,.0f} ops/s")


if __name__ == "__main__":
    main()
