"""The orchestrator commits handled offsets at most every COMMIT_EVERY_S while records flow, and keeps the
latest offset of each partition."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaConnectionError

from saga_orchestrator.orchestrator import consumer as consumer_module
from saga_orchestrator.orchestrator.consumer import _Offsets


class _Consumer:
    def __init__(self, fail: bool = False) -> None:
        self.commits: list[dict[TopicPartition, int]] = []
        self._fail = fail

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        if self._fail:
            raise KafkaConnectionError("broker away")
        self.commits.append(dict(offsets))


def test_offsets_are_due_only_after_the_interval_and_carry_each_partitions_latest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    offsets, kafka = _Offsets(), _Consumer()
    a, b = TopicPartition("saga.start", 0), TopicPartition("saga.start", 1)
    offsets.handled({a: 5})
    offsets.handled({a: 9, b: 3})
    assert not offsets.due()
    now[0] += consumer_module.COMMIT_EVERY_S
    assert offsets.due()
    asyncio.run(offsets.commit(kafka))
    assert kafka.commits == [{a: 9, b: 3}]
    now[0] += 10
    assert not offsets.due()  # nothing handled since
    asyncio.run(offsets.commit(kafka))
    assert kafka.commits == [{a: 9, b: 3}]


def test_a_commit_that_fails_while_stopping_is_logged_not_raised() -> None:
    offsets, kafka = _Offsets(), _Consumer(fail=True)
    offsets.handled({TopicPartition("saga.start", 0): 1})
    asyncio.run(offsets.commit(kafka, quietly=True))
    offsets.handled({TopicPartition("saga.start", 0): 2})
    with pytest.raises(KafkaConnectionError):
        asyncio.run(offsets.commit(kafka))




class _Hanging:
    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        await asyncio.sleep(3600)  # a coordinator that never answers


def test_a_stopping_consumer_waits_for_a_commit_only_so_long(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(consumer_module, "QUIET_COMMIT_S", 0.05)
    offsets = _Offsets()
    offsets.handled({TopicPartition("saga.start", 0): 1})
    started = time.monotonic()
    asyncio.run(offsets.commit(_Hanging(), quietly=True))
    assert time.monotonic() - started < 2
