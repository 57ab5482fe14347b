"""Records handed to an aiokafka producer as one record batch per topic partition.

``producer.send`` checks, partitions and queues every record on its own; filling one batch per partition and
handing it over with ``send_batch`` cost about a third of the CPU per record (50-record rounds against the
local broker: 11-12 against 21-30 microseconds). The partition is the one ``send`` would have picked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from ..schemas.partitioning import partition_for

Record = tuple[str, bytes, bytes | None, list[tuple[str, bytes]]]  # topic, key, value, headers


async def queue_batches(producer: Any, records: Sequence[Record], futures: list[asyncio.Future[Any]]) -> None:
    """Hand ``records`` to the started ``producer``, in order within each topic partition, appending every
    batch's delivery future to ``futures`` (also when a later record raises)."""
    batches: dict[tuple[str, int], Any] = {}
    partitions: dict[str, tuple[int, ...]] = {}
    for topic, key, value, headers in records:
        if topic not in partitions:
            partitions[topic] = tuple(sorted(await producer.partitions_for(topic)))
        where = (topic, partition_for(key, partitions[topic]))
        builder = batches.get(where)
        if builder is None or builder.append(key=key, value=value, timestamp=None, headers=headers) is None:
            if builder is not None:  # full: send it and go on with a new one (the producer keeps their order)
                futures.append(await producer.send_batch(builder, topic, partition=where[1]))
            batches[where] = builder = producer.create_batch()
            builder.append(key=key, value=value, timestamp=None, headers=headers)  # a new batch takes any record
    for (topic, partition), builder in batches.items():
        futures.append(await producer.send_batch(builder, topic, partition=partition))
