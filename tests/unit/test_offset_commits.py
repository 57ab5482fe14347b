"""The orchestrator commits handled offsets at most every COMMIT_EVERY_S while records flow, and keeps the
latest offset of each partition."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import IllegalStateError, KafkaConnectionError

from saga_orchestrator.orchestrator import consumer as consumer_module
from saga_orchestrator.orchestrator.consumer import _Offsets

ASSIGNED = {TopicPartition("saga.start", number) for number in range(4)}


class _Consumer:
    def __init__(self, fail: BaseException | None = None, assigned: set[TopicPartition] = ASSIGNED) -> None:
        self.commits: list[dict[TopicPartition, int]] = []
        self._fail = fail
        self._assigned = assigned

    def assignment(self) -> set[TopicPartition]:
        return self._assigned

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        if self._fail is not None:
            raise self._fail
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
    offsets, kafka = _Offsets(), _Consumer(fail=KafkaConnectionError("broker away"))
    offsets.handled({TopicPartition("saga.start", 0): 1})
    asyncio.run(offsets.commit(kafka, quietly=True))
    offsets.handled({TopicPartition("saga.start", 0): 2})
    with pytest.raises(KafkaConnectionError):
        asyncio.run(offsets.commit(kafka))




def test_only_partitions_still_assigned_are_committed() -> None:
    kept, revoked = TopicPartition("saga.start", 0), TopicPartition("saga.start", 1)
    offsets, kafka = _Offsets(), _Consumer(assigned={kept})
    offsets.handled({kept: 7, revoked: 4})
    asyncio.run(offsets.commit(kafka))
    assert kafka.commits == [{kept: 7}]  # the revoked one's next owner reads from its own committed offset


def test_a_commit_refused_for_a_partition_just_revoked_keeps_the_consumer() -> None:
    offsets = _Offsets()
    offsets.handled({TopicPartition("saga.start", 0): 1})
    # aiokafka raises IllegalStateError (a KafkaError, which restarted the consumer) for a partition that a
    # rebalance took away between the check and the commit
    asyncio.run(offsets.commit(_Consumer(fail=IllegalStateError("not assigned"))))


class _Hanging:
    def assignment(self) -> set[TopicPartition]:
        return ASSIGNED

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        await asyncio.sleep(3600)  # a coordinator that never answers


def test_a_stopping_consumer_waits_for_a_commit_only_so_long(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(consumer_module, "QUIET_COMMIT_S", 0.05)
    offsets = _Offsets()
    offsets.handled({TopicPartition("saga.start", 0): 1})
    started = time.monotonic()
    asyncio.run(offsets.commit(_Hanging(), quietly=True))
    assert time.monotonic() - started < 2
