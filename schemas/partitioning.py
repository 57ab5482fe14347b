"""Which partition a saga's records go to: the Kafka key is the saga id on every saga topic, partitioned by
the default partitioner of every Kafka client (murmur2 of the key), so one saga's messages keep their order
and a reader finds a saga's events on one partition of ``saga.events``."""

from __future__ import annotations

import functools

from aiokafka.partitioner import DefaultPartitioner


@functools.lru_cache(maxsize=65_536)
def partition_for(key: bytes, partitions: tuple[int, ...]) -> int:
    """The partition of ``key`` among ``partitions`` (sorted) that every Kafka client's default partitioner
    picks (murmur2); cached, because the records of one saga share a key."""
    return DefaultPartitioner()(key, list(partitions), list(partitions))  # type: ignore[no-any-return]
