"""The orchestrator's Kafka loop: consume a batch, handle it in Postgres, then commit the offsets."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, ConsumerRecord, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError

from ..infra import kafka_records
from ..infra.consumer_lag import partition_lags
from ..infra.faults import crash_point
from ..infra.health import current as current_health
from ..infra.isolation import OutageWait
from ..infra.kafka_clients import KafkaClients
from ..schemas.records import ConsumedRecord
from .assignment import CoPartitionedAssignor, GroupView, Served
from .horizon import HOLD_ALL, PartitionProgress, read_horizon
from .inbound import RecordParser
from .service import SagaService

log = logging.getLogger("saga.orchestrator.consumer")

MAX_BACKOFF_S = 5.0
HORIZON_EVERY_S = 0.05
POLLS_IN_FLIGHT = 3  # polls handled at once (their transactions overlap); offsets still commit in poll order
MIN_BATCH = 20  # messages: below this, splitting a poll over more transactions costs more than it saves
# The fetch follows the load (FetchPacing, SAGA_FETCH_PACING=adaptive). A poll of at most SMALL_POLL records
# means the orchestrator keeps up: the next fetch answers as soon as one record arrives (a trip has four
# orchestrator hops, and a fixed wait sat on each) and otherwise long-polls IDLE_FETCH_WAIT_MS, which is how
# often a quiet read horizon (timers) moves on. A bigger poll means records pile up: the next fetch waits for
# FETCH_MIN_BYTES for up to FETCH_WAIT_MS * (records - SMALL_POLL) / FULL_POLL, capped at FETCH_WAIT_MS
# (SAGA_FETCH_WAIT_MS), so the wait, and the batch, grow with the arrival rate. A poll costs about as much
# CPU whether it holds one message or ten (across the stack, some 6 ms here: the fetch of every partition,
# the transaction, the relay's pass), so the wait reaches the cap early, from about 25 sagas/s on
# (FULL_POLL / FETCH_WAIT_MS messages/s). bench/throughput, interleaved, 2 runs each, FULL_POLL 15 against 50:
# at 15 sagas/s p50 54-57 ms against 55-60, 55-58 ms of CPU per saga against 55-62; at 50 sagas/s p50
# 282-294 ms against 147-160, but 15-16 ms of CPU per saga against 34-37 (1.7-1.8 of the 2 cores busy).
# SAGA_FETCH_PACING=fixed waits FETCH_WAIT_MS whenever records flow, and answers at once only after
# IDLE_AFTER_EMPTY_POLLS empty polls: at 15 sagas/s p50 281 ms, 34 ms of CPU per saga. 75 ms measured best
# under load (at 210 sagas/s, 6 interleaved runs each, against 100: about 0.5 ms more CPU per saga, 7.2-8.2
# against 6.7-8.1, and p99 0.68-0.93 s against 0.82-1.19); and against 50, in a slow spell of the machine, 10
# interleaved pairs at 200 sagas/s: p99 median 1.04 s against 1.08 (each better in 5 pairs), 3 pairs at 400
# offered: 302-323 sagas/s kept up with against 279-311, 2 unpaced pairs: 320 and 440 sagas/s against 284 and 346.
FETCH_WAIT_MS = 75
FETCH_MIN_BYTES = 1 << 20
IDLE_FETCH_WAIT_MS = 500
POLL_TIMEOUT_MS = 100  # longest a poll waits for records while fetches wait for batches
IDLE_AFTER_EMPTY_POLLS = 3
SMALL_POLL = 1
FULL_POLL = 15
# Offsets are committed at most every COMMIT_EVERY_S while records flow, and at once when a poll comes back
# empty. Committing after every poll cost a broker write per poll (an offset commit of 16 partitions took the
# local broker about 1.8 ms of CPU); a crash re-reads at most this much more, which the inbox skips.
COMMIT_EVERY_S = 0.5
QUIET_COMMIT_S = 5.0  # the longest a consumer that stops waits to commit (a coordinator that went away)
ASSIGNORS = (CoPartitionedAssignor(),)
"""The strategy of a member that advertises no definition versions (each consumer builds its own, with the versions
it serves). Partition k of every topic to one instance, and no second strategy: aiokafka 0.14 sends one
JoinGroup per assignor it is given, each with different protocols, and the group coordinator answers a member
whose metadata changed while the group completes a rebalance with a new rebalance. Two members joining at the
same moment then rebalance each other for ever (generation 6,817 after eleven minutes, seen here;
aio-libs/aiokafka#1168). An instance of a version before this assignor cannot join a group of this one
(InconsistentGroupProtocol): stop the old orchestrators before starting the new ones."""
HAND_OVER_WAIT_S = 10.0  # the longest a rebalance waits for the polls under way (then the next owner re-reads)


class FetchPacing:
    """Sets the wait of the consumer's next fetch from the last polls (see ``SMALL_POLL``). It changes
    aiokafka's fetcher parameters between requests (private attributes of the pinned aiokafka, checked by
    ``infra.kafka_records.install``)."""

    def __init__(self, busy_wait_ms: int, adaptive: bool = True) -> None:
        self._busy_wait_ms = busy_wait_ms
        self._adaptive = adaptive
        self._answering = (1, max(busy_wait_ms, IDLE_FETCH_WAIT_MS))
        self._empty_polls = 0
        self.mode = self._answering

    def next_fetch(self, records: int) -> tuple[int, int]:
        """``(fetch_min_bytes, fetch_max_wait_ms)`` for the fetch after a poll of ``records`` records."""
        if not self._adaptive:
            self._empty_polls = 0 if records else self._empty_polls + 1
            if records or (self.mode != self._answering and self._empty_polls < IDLE_AFTER_EMPTY_POLLS):
                return FETCH_MIN_BYTES, self._busy_wait_ms
            return self._answering
        wait_ms = min(self._busy_wait_ms, self._busy_wait_ms * max(0, records - SMALL_POLL) // FULL_POLL)
        return (FETCH_MIN_BYTES, wait_ms) if wait_ms > 0 else self._answering

    @property
    def poll_timeout_ms(self) -> int:
        """How long the next poll may wait for records. While fetches answer at once, an empty poll comes
        only when the broker's long poll ended empty; polling more often would find nothing new, not even
        for the read horizon."""
        return self.mode[1] if self.mode == self._answering else POLL_TIMEOUT_MS

    def polled(self, consumer: AIOKafkaConsumer, records: int) -> None:
        """A poll returned ``records`` records: set the next fetches' mode."""
        mode = self.next_fetch(records)
        if mode != self.mode:
            fetcher = consumer._fetcher
            fetcher._fetch_min_bytes, fetcher._fetch_max_wait_ms = mode
            self.mode = mode


class _Offsets:
    """Offsets of handled polls not committed yet; committed at most every ``COMMIT_EVERY_S`` while records
    flow (``due``) and whenever the caller sees a quiet moment."""

    def __init__(self) -> None:
        self._pending: dict[TopicPartition, int] = {}
        self._committed_at = time.monotonic()

    def handled(self, offsets: dict[TopicPartition, int]) -> None:
        self._pending.update(offsets)

    def due(self) -> bool:
        return bool(self._pending) and time.monotonic() - self._committed_at >= COMMIT_EVERY_S

    async def commit(self, consumer: AIOKafkaConsumer, quietly: bool = False) -> None:
        """Commit the pending offsets of the partitions still assigned (a revoked one's belong to its next
        owner, who reads them again; the inbox skips what committed). ``quietly``: while stopping or handing
        partitions over, when Kafka may be gone; a failure or ``QUIET_COMMIT_S`` without an answer is logged."""
        assigned = consumer.assignment()
        pending = {tp: offset for tp, offset in self._pending.items() if tp in assigned}
        self._pending = {}
        self._committed_at = time.monotonic()
        if not pending:
            return
        try:
            async with asyncio.timeout(QUIET_COMMIT_S if quietly else None):
                await consumer.commit(pending)
        except (CommitFailedError, IllegalStateError) as error:
            # A rebalance took the partitions away meanwhile; the new owner re-reads, the inbox dedupes.
            log.warning("offset commit failed after rebalance", extra={"error": repr(error)})
        except Exception as error:  # stopping or handing over: the next owner reads these records again
            if not quietly:
                raise
            log.warning("offsets not committed while stopping", extra={"error": repr(error)})


@dataclass(frozen=True)
class _Round:
    """The polls dispatched under one assignment: ``revoked`` is set when its partitions are taken back."""

    revoked: asyncio.Event


@dataclass(frozen=True)
class _Poll:
    """One poll's records on their way through Postgres: the saga keys among them, the handling task (False
    when it gave its records up) and the assignment it was fetched under."""

    batches: dict[TopicPartition, list[ConsumerRecord]]
    keys: set[bytes | None]
    task: asyncio.Task[bool]
    round: _Round


class _HandOver(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka's base is untyped
    """Before partitions are revoked, the polls under way finish and their offsets are committed."""

    def __init__(self, owner: OrchestratorConsumer, consumer: AIOKafkaConsumer) -> None:
        self._owner = owner
        self._consumer = consumer

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self._owner.owned_partitions = frozenset()  # its timers are the next owner's from now on
        self._owner.revoked()
        if revoked:
            await self._owner.hand_over(self._consumer)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self._owner.owned_partitions = frozenset(tp.partition for tp in assigned)
        log.info("partitions assigned", extra={"partitions": sorted(self._owner.owned_partitions)})


def consumed(record: ConsumerRecord) -> ConsumedRecord:
    """Keep a consumed record's original bytes and headers."""
    return ConsumedRecord(topic=record.topic, partition=record.partition, offset=record.offset, key=record.key,
                          value=record.value, headers=tuple((k, v) for k, v in (record.headers or ())))


class OrchestratorConsumer:
    """Consumes start, control and result topics; offsets are committed only after Postgres commits."""

    def __init__(self, service: SagaService, parser: RecordParser, kafka: KafkaClients, group_id: str,
                 concurrency: int = 8, max_records: int = 500, batch_size: int = 100,
                 fetch_wait_ms: int = FETCH_WAIT_MS, adaptive_fetch: bool = True,
                 served: Served = frozenset(), group_view: GroupView | None = None) -> None:
        self._service = service
        self._parser = parser
        self._kafka = kafka
        self._group_id = group_id
        self._concurrency = concurrency
        self._slots = asyncio.Semaphore(concurrency)
        self._batch_size = batch_size
        self._max_records = max_records
        self._fetch_wait_ms = fetch_wait_ms
        self._adaptive_fetch = adaptive_fetch
        self.handled = 0
        # True while a consumer is in the group with its partitions; until then replies waiting on the
        # results topics are unread, so the timer scheduler holds step timeouts (see bootstrap).
        self.consuming = False
        # Wall-clock ms up to which every reply has been read (orchestrator/horizon.py); timers due later wait.
        self.read_horizon_ms = HOLD_ALL
        # The partition numbers assigned to this instance (orchestrator/assignment.py gives it the same ones
        # on every topic): its timer scheduler fires the timers of sagas on them. None until assigned.
        self.owned_partitions: frozenset[int] | None = None
        self._last_record_ms: dict[TopicPartition, int] = {}
        self._horizon_at = 0.0
        self._result_topics = parser.result_topic_names()
        # The current consumer's polls under way and offsets to commit, shared with the rebalance listener,
        # which finishes them before partitions move to another instance.
        self._in_flight: deque[_Poll] = deque()
        self._offsets = _Offsets()
        # The first offset of records given up on each partition (a poll that waited when its partitions were
        # revoked): no offset past it is committed until a poll from there on went through.
        self._given_up: dict[TopicPartition, int] = {}
        self._finishing = asyncio.Lock()
        self._outage = OutageWait("orchestrator messages", max_s=MAX_BACKOFF_S)
        self._live: AIOKafkaConsumer | None = None  # the consumer of the current round, for its lag
        # The (saga type, version) pairs this instance serves, advertised to the group's assignor, and what the
        # group serves, learnt at each assignment (orchestrator/assignment.py).
        self._served = served
        self.group_view = group_view if group_view is not None else GroupView()
        self._round = _Round(asyncio.Event())

    def revoked(self) -> None:
        """The partitions are being taken back: polls that wait give their records up to the next owner."""
        self._round.revoked.set()
        self._round = _Round(asyncio.Event())

    @property
    def group_id(self) -> str:
        """The consumer group this consumer joins."""
        return self._group_id

    async def partition_lags(self) -> dict[tuple[str, int], int]:
        """The lag of each partition assigned here, by (topic, partition) (``infra.consumer_lag``); empty while
        not in the group. Read from the consumer's own state: cheap enough for every scrape."""
        consumer = self._live
        if consumer is None or not self.consuming:
            return {}

        def end_offset(tp: TopicPartition) -> int | None:
            stable: int | None = consumer.last_stable_offset(tp)
            return consumer.highwater(tp) if stable is None else stable

        return await partition_lags(consumer.assignment(), end_offset, consumer.position,
                                    _first_unhandled(self._in_flight))

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop`` is set, reconnecting with backoff when Kafka is away."""
        reconnect = OutageWait("orchestrator consumer", first_s=0.2, max_s=MAX_BACKOFF_S)
        while not stop.is_set():
            consumer = self._kafka.consumer(
                group_id=self._group_id,
                partition_assignment_strategy=(CoPartitionedAssignor(self._served, self.group_view),),
                enable_auto_commit=False, auto_offset_reset="earliest", max_poll_records=self._max_records,
                isolation_level="read_committed", fetch_min_bytes=1,
                fetch_max_wait_ms=max(self._fetch_wait_ms, IDLE_FETCH_WAIT_MS),
                fetch_max_bytes=kafka_records.FETCH_MAX_BYTES,
                max_partition_fetch_bytes=kafka_records.PARTITION_FETCH_BYTES,
            )
            consumer.subscribe(self._parser.topic_names(), listener=_HandOver(self, consumer))
            self._live = consumer
            try:
                await consumer.start()  # returns once the group is joined and partitions are assigned
                self.consuming = current_health().consuming = True
                reconnect.over()
                log.info("orchestrator consumer started", extra={"group": self._group_id})
                await self._poll(consumer, stop)
            except Exception as error:  # a supervisor loop: start over with a new consumer, never exit
                if stop.is_set():
                    raise
                await reconnect.pause(error, stop)
            finally:
                self.consuming = current_health().consuming = False
                self.owned_partitions = frozenset()
                self.read_horizon_ms = HOLD_ALL
                self._last_record_ms.clear()
                self._horizon_at = 0.0
                await consumer.stop()

    async def _poll(self, consumer: AIOKafkaConsumer, stop: asyncio.Event) -> None:
        """Fetch, hand each poll to Postgres, and commit offsets in poll order as the polls finish.

        Up to ``POLLS_IN_FLIGHT`` polls are handled at once, so the next poll's transactions start while
        the previous ones wait for Postgres; a saga's messages still go through in order (a poll's sagas
        that an earlier poll still handles wait for it). Offsets are committed only for a poll that
        finished after every earlier one did.
        """
        in_flight: deque[_Poll] = deque()
        self._in_flight = in_flight
        self._offsets = offsets = _Offsets()
        self._given_up = {}
        fetch: asyncio.Future[dict[TopicPartition, list[ConsumerRecord]]] | None = None
        pacing = FetchPacing(self._fetch_wait_ms, self._adaptive_fetch)
        try:
            while not stop.is_set():
                if fetch is None and len(in_flight) < POLLS_IN_FLIGHT:
                    fetch = asyncio.ensure_future(consumer.getmany(timeout_ms=pacing.poll_timeout_ms,
                                                                   max_records=self._max_records))
                waiting = {task for task in (fetch, in_flight[0].task if in_flight else None) if task is not None}
                await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if fetch is not None and fetch.done():
                    batches, fetch = fetch.result(), None
                    pacing.polled(consumer, sum(len(records) for records in batches.values()))
                    if batches:
                        in_flight.append(self._dispatch(batches, in_flight, stop, self._round))
                    elif not in_flight:
                        await self._advance_horizon(consumer, {}, in_flight)
                        await offsets.commit(consumer)
                await self._finish_done(consumer)
        finally:
            if fetch is not None:
                fetch.cancel()
            await offsets.commit(consumer, quietly=True)
            # Transactions already under way finish (or fail) on their own; their offsets stay uncommitted,
            # so whoever owns the partitions next reads them again and the inbox skips what committed.
            await asyncio.gather(*(poll.task for poll in in_flight), return_exceptions=True)

    def _dispatch(self, batches: dict[TopicPartition, list[ConsumerRecord]], earlier: Iterable[_Poll],
                  stop: asyncio.Event, round_: _Round) -> _Poll:
        keys = {record.key for records in batches.values() for record in records}
        blockers = [poll.task for poll in earlier if poll.keys & keys]
        return _Poll(batches, keys, asyncio.create_task(self._process_after(blockers, batches, stop, round_)),
                     round_)

    async def _process_after(self, blockers: list[asyncio.Task[bool]],
                             batches: dict[TopicPartition, list[ConsumerRecord]], stop: asyncio.Event,
                             round_: _Round) -> bool:
        # Waiting on whole earlier polls is coarser than per saga, and cheaper: letting the poll's other sagas
        # go first splits the poll into twice the transactions, and under load (a flight and a hotel reply
        # of one saga often land in consecutive polls) that cost more than the wait saved. At 200 sagas/s
        # (bench/throughput, 5 interleaved runs each) per saga took 8.7-10.0 ms of CPU per saga and reached
        # p99 1.5-3.5 s, whole polls 8.8-9.4 ms and p99 1.5-2.7 s.
        await asyncio.gather(*blockers, return_exceptions=True)
        return await self._process_until_done(batches.values(), stop, round_)

    async def _finish_done(self, consumer: AIOKafkaConsumer) -> None:
        """Finish the oldest polls that are done, in poll order: move the read horizon past each and mark its
        offsets for commit (and commit them when due)."""
        async with self._finishing:  # the poll loop and the rebalance listener both finish polls
            while self._in_flight and self._in_flight[0].task.done():
                poll = self._in_flight.popleft()
                # re-raises when it failed (only while stopping: failed ones are retried)
                if not poll.task.result():  # given up: whoever owns its partitions next reads them again
                    for tp, records in poll.batches.items():
                        self._given_up[tp] = min(self._given_up.get(tp, records[0].offset), records[0].offset)
                    continue
                await self._advance_horizon(consumer, poll.batches, self._in_flight)
                self._offsets.handled(self._committable(poll.batches))
                crash_point("orchestrator.after_commit")  # Postgres committed, the offsets not: redelivery
        # Outside the lock: a commit during a rebalance waits for it, and the rebalance's listener for the lock.
        if self._offsets.due():
            await self._offsets.commit(consumer)

    def _committable(self, batches: dict[TopicPartition, list[ConsumerRecord]]) -> dict[TopicPartition, int]:
        """The offsets to commit after ``batches`` went through: none on a partition where records before them
        were given up (a poll fetched before the revocation, or after it under the old positions, would
        otherwise commit past them)."""
        offsets = {}
        for tp, records in batches.items():
            floor = self._given_up.get(tp)
            if floor is not None and records[0].offset > floor:
                continue
            self._given_up.pop(tp, None)  # read again from there on (positions reset to the committed offsets)
            offsets[tp] = records[-1].offset + 1
        return offsets

    async def hand_over(self, consumer: AIOKafkaConsumer) -> None:
        """Partitions are about to move (a rebalance): let the polls under way commit in Postgres, then
        commit their offsets while the partitions are still ours, so the next owner starts after them."""
        tasks = [poll.task for poll in self._in_flight]
        if tasks:  # bounded: a poll waiting out a Postgres outage must not stall the group's rebalance
            await asyncio.wait(tasks, timeout=HAND_OVER_WAIT_S)
        try:
            await self._finish_done(consumer)
        except Exception as error:  # a poll that failed is read again by the next owner
            log.warning("a poll failed before the hand-over", extra={"error": repr(error)})
        await self._offsets.commit(consumer, quietly=True)

    async def _advance_horizon(self, consumer: AIOKafkaConsumer, handled: dict[TopicPartition, list[ConsumerRecord]],
                               in_flight: Iterable[_Poll]) -> None:
        """Recompute the read horizon after ``handled`` went through Postgres (at most every
        ``HORIZON_EVERY_S``: it looks at every results partition, and timers are scanned no more often).
        Records fetched but still ``in_flight`` count as unread."""
        for tp, records in handled.items():
            if records:
                self._last_record_ms[tp] = records[-1].timestamp
        now = time.monotonic()
        if now - self._horizon_at < HORIZON_EVERY_S:
            return
        self._horizon_at = now
        unread_from = _first_unhandled(in_flight)
        progress = []
        for tp in consumer.assignment():
            if tp.topic in self._result_topics:
                stable = consumer.last_stable_offset(tp)
                progress.append(PartitionProgress(
                    position=unread_from[tp] if tp in unread_from else await consumer.position(tp),
                    end_offset=consumer.highwater(tp) if stable is None else stable,
                    checked_ms=consumer.last_poll_timestamp(tp),
                    last_record_ms=self._last_record_ms.get(tp)))
        self.read_horizon_ms = read_horizon(progress)

    async def _process_until_done(self, batches: Iterable[list[ConsumerRecord]], stop: asyncio.Event,
                                  round_: _Round | None = None) -> bool:
        """Handle the records, waiting out what fails (a platform fault, a saga whose definition version
        another member serves) until they go through (True), or until ``round_``'s partitions are revoked
        while they wait (False: given up, offsets not committed; the next owner reads them again)."""
        by_saga: dict[bytes | None, list[ConsumedRecord]] = defaultdict(list)
        for records in batches:
            for record in records:
                by_saga[record.key].append(consumed(record))
        while True:
            try:
                # Every saga's chain finishes (or fails) before a retry starts, so a retry never runs next
                # to a leftover of the previous round.
                results = await asyncio.gather(*(self._process_chunk(chunk)
                                                 for chunk in self._chunks(list(by_saga.values()))),
                                               return_exceptions=True)
                failures = [result for result in results if isinstance(result, BaseException)]
                if failures:
                    raise failures[0]
            except Exception as error:  # a platform fault: the poll is handed over again, never skipped
                if stop.is_set():
                    raise
                if round_ is not None and round_.revoked.is_set():
                    log.info("records given up to the partitions' next owner", extra={"error": repr(error)})
                    return False
                await _pause(self._outage, error, stop, round_.revoked if round_ is not None else None)
                continue
            self._outage.over()
            return True

    def _chunks(self, sagas: list[list[ConsumedRecord]]) -> list[list[list[ConsumedRecord]]]:
        """Spread a poll's sagas over transactions of at least ``MIN_BATCH`` messages (a transaction costs
        about the same whatever its size) and at most ``batch_size``; up to ``concurrency`` of them run at
        once, so the Postgres work of one overlaps the decisions of another."""
        total = sum(len(raws) for raws in sagas)
        wanted = max(-(-total // self._batch_size), min(self._concurrency, total // MIN_BATCH))
        count = max(1, min(len(sagas), wanted))
        chunks: list[list[list[ConsumedRecord]]] = [[] for _ in range(count)]
        for index, raws in enumerate(sagas):
            chunks[index % count].append(raws)
        return chunks

    async def _process_chunk(self, sagas: list[list[ConsumedRecord]]) -> None:
        """One transaction for the chunk's records, each read as a message (or a RejectedRecord) in order."""
        async with self._slots:
            envelopes = [self._parser.parse(raw) for raws in sagas for raw in raws]
            await self._service.handle_many(envelopes)
            self._count(len(envelopes))

    def _count(self, messages: int) -> None:
        self.handled += messages
        current_health().handled(messages)


async def _pause(outage: OutageWait, error: Exception, stop: asyncio.Event, revoked: asyncio.Event | None) -> None:
    """``outage``'s pause, ended early as soon as ``stop`` or ``revoked`` is set."""
    if revoked is None:
        await outage.pause(error, stop)
        return
    either = asyncio.Event()
    waits = [asyncio.ensure_future(event.wait()) for event in (stop, revoked)]
    for wait in waits:
        wait.add_done_callback(lambda _done: either.set())
    try:
        await outage.pause(error, either)
    finally:
        for wait in waits:
            wait.cancel()


def _first_unhandled(in_flight: Iterable[_Poll]) -> dict[TopicPartition, int]:
    """The first offset of each partition's records fetched but still in flight (not yet handled)."""
    first: dict[TopicPartition, int] = {}
    for poll in in_flight:
        for tp, records in poll.batches.items():
            first.setdefault(tp, records[0].offset)
    return first
