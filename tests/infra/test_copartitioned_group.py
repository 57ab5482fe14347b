"""The orchestrators' assignor in a real consumer group: two members, partition k of every topic on one."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer

from saga_orchestrator.infra.kafka_admin import ensure_topics
from saga_orchestrator.infra.kafka_clients import KafkaClients
from saga_orchestrator.orchestrator.assignment import CoPartitionedAssignor, GroupView, Served
from saga_orchestrator.orchestrator.consumer import ASSIGNORS


def _numbers(consumer: AIOKafkaConsumer) -> dict[str, set[int]]:
    found: dict[str, set[int]] = {}
    for tp in consumer.assignment():
        found.setdefault(tp.topic, set()).add(tp.partition)
    return found


async def _split_between_two(kafka: KafkaClients, topics: list[str], group: str, timeout_s: float
                             ) -> list[dict[str, set[int]]]:
    """Start two members of ``group`` at the same moment and poll both until they hold every partition."""
    members = [kafka.consumer(*topics, group_id=group, enable_auto_commit=False,
                              partition_assignment_strategy=ASSIGNORS)
               for _ in range(2)]
    splits: list[dict[str, set[int]]] = []

    async def split() -> None:
        nonlocal splits
        await asyncio.gather(*(member.start() for member in members))
        while True:  # the second member's join makes the group rebalance; poll so that both take part
            await asyncio.gather(*(member.getmany(timeout_ms=200) for member in members))
            splits = [_numbers(member) for member in members]
            if all(splits) and sum(len(n) for split in splits for n in split.values()) == 3 * len(topics):
                return

    try:  # a group that never settles blocks getmany (no assignment to fetch for): bound the whole wait
        await asyncio.wait_for(split(), timeout_s)
    except TimeoutError:
        raise AssertionError(f"{group} not split between two members in {timeout_s} s: {splits}") from None
    finally:
        await asyncio.gather(*(asyncio.wait_for(member.stop(), 15) for member in members), return_exceptions=True)
    return splits


async def test_two_members_split_every_topic_the_same_way(kafka_bootstrap: str, topic_prefix: str) -> None:
    kafka = KafkaClients(kafka_bootstrap)
    topics = [f"{topic_prefix}copart.{name}" for name in ("start", "control", "flight.results")]
    # 3 partitions: with an even count round robin would pair the numbers up across topics by chance
    await ensure_topics(kafka, topics, 3)
    splits = await _split_between_two(kafka, topics, f"{topic_prefix}copart", 30)
    for split in splits:
        assert set(split) == set(topics)
        assert len({frozenset(numbers) for numbers in split.values()}) == 1, split  # same numbers everywhere
    first, second = (next(iter(split.values())) for split in splits)
    assert first.isdisjoint(second) and first | second == {0, 1, 2}
    assert sorted([len(first), len(second)]) == [1, 2]


async def test_two_members_starting_together_settle_every_time(kafka_bootstrap: str, topic_prefix: str) -> None:
    """With a second, fallback assignor, two members joining at the same moment rebalanced each other for ever
    about one time in eight (each JoinGroup of aiokafka 0.14 carried other protocols than the one before)."""
    kafka = KafkaClients(kafka_bootstrap)
    topics = [f"{topic_prefix}together.{name}" for name in ("start", "control")]
    await ensure_topics(kafka, topics, 3)
    for attempt in range(12):
        await _split_between_two(kafka, topics, f"{topic_prefix}together-{attempt}", 20)


V1: Served = frozenset({("trip", 1, "f1")})
V12: Served = frozenset({("trip", 1, "f1"), ("trip", 2, "f2")})


async def _settle(members: list[AIOKafkaConsumer], wanted: list[int], timeout_s: float, any_order: bool = False
                  ) -> list[dict[str, set[int]]]:
    """Poll ``members`` until each holds ``wanted[i]`` partitions of every topic (the same numbers in each);
    ``any_order``: those counts, whichever member holds which."""
    splits: list[dict[str, set[int]]] = []

    async def settle() -> None:
        nonlocal splits
        while True:
            await asyncio.gather(*(member.getmany(timeout_ms=200) for member in members))
            splits = [_numbers(member) for member in members]
            counts = [len(next(iter(split.values()), set())) for split in splits]
            settled = sorted(counts) == sorted(wanted) if any_order else counts == wanted
            if settled and all(len({frozenset(n) for n in split.values()}) <= 1 for split in splits):
                return

    try:
        await asyncio.wait_for(settle(), timeout_s)
    except TimeoutError:
        raise AssertionError(f"not settled on {wanted} in {timeout_s} s: {splits}") from None
    return splits


async def test_partitions_go_to_the_member_serving_every_version(kafka_bootstrap: str, topic_prefix: str) -> None:
    """A rolling deploy: the member serving trip v1 and v2 takes every partition from the one serving v1 only;
    when it leaves they all go back; members serving the same versions split them."""
    kafka = KafkaClients(kafka_bootstrap)
    topics = [f"{topic_prefix}served.{name}" for name in ("start", "control", "flight.results")]
    await ensure_topics(kafka, topics, 3)
    group = f"{topic_prefix}served"
    views = [GroupView(grace_s=0) for _ in range(3)]

    def member(served: Served, view: GroupView) -> AIOKafkaConsumer:
        return kafka.consumer(*topics, group_id=group, enable_auto_commit=False,
                              partition_assignment_strategy=(CoPartitionedAssignor(served, view),))

    old, new, other_old = member(V1, views[0]), member(V12, views[1]), member(V1, views[2])
    started: list[AIOKafkaConsumer] = []
    try:
        for consumer in (old, new):
            await consumer.start()
            started.append(consumer)
        await _settle([old, new], [0, 3], 40)
        assert views[0].serves("trip", 2, "f2")  # the old member learnt that another one serves v2
        await new.stop()
        started.remove(new)
        await _settle([old], [3], 40)
        assert not views[0].serves("trip", 2)  # nobody serves it any more
        await other_old.start()
        started.append(other_old)
        # the same versions: split as before
        first, second = await _settle([old, other_old], [2, 1], 40, any_order=True)
        assert next(iter(first.values())).isdisjoint(next(iter(second.values())))
    finally:
        await asyncio.gather(*(asyncio.wait_for(c.stop(), 15) for c in started), return_exceptions=True)
