"""The one isolation ladder, and the one wait for a platform that is away.

A service hands work over in batches: the orchestrator its messages and due timers, a participant worker its
commands, a relay its outbox rows. When a batch fails, ``IsolationLadder`` finds what failed, one rung at a
time, and everything else goes on:

1. the batch, as one unit (one transaction, one publish);
2. each group alone (a saga's messages, a Kafka key's rows), when the batch holds several;
3. the one item alone, ``poison_attempts`` times;
4. the service's own end for that item (quarantine its saga; dead-letter it and answer ``Unprocessable``;
   park the row).

What moves it down a rung is a failure ``infra.failures.classify`` calls ``RECORD``. A ``CONFLICT`` is retried at
once on the same rung (a batch of several groups goes down to its groups instead, so one contended saga cannot
hold the others back). A ``PLATFORM`` fault at any rung leaves the ladder: the caller waits it out with
``OutageWait`` and hands the same work over again, unacknowledged, so an outage spends no poison attempt, no
step attempt and no retry budget.

Each unit it runs is traced (``infra.tracing.UnitSpans``): the ladder opens the unit's spans, named for the
service's work, and ends them with the unit, a failed try's error on each; the service names the saga traces.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from opentelemetry.trace import SpanKind

from . import tracing
from .failures import Fault, classify, describe
from .health import ServiceHealth
from .health import current as current_health

log = logging.getLogger("saga.isolation")

ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")
T = TypeVar("T")
ItemT_contra = TypeVar("ItemT_contra", contravariant=True)
ResultT_co = TypeVar("ResultT_co", covariant=True)

CONFLICT_RETRIES = 8
"""Tries of one unit that keeps losing to concurrent writers before it counts as failed."""

GROUPS_ONE_BY_ONE = "batch failed, handling its groups one by one"
SPLIT_BY_A_CONFLICT = "batch lost to a concurrent writer, handling its groups one by one"
ITEMS_ONE_AT_A_TIME = "group failed, handling its items one at a time"
ISOLATING = "item failed every time on its own: isolating it"
OUTSIDE_ISOLATION = "work failed outside its isolation, trying it again"
BELOW_THE_BATCH = (GROUPS_ONE_BY_ONE, ITEMS_ONE_AT_A_TIME, ISOLATING, OUTSIDE_ISOLATION)
"""What is logged (logger ``saga.isolation``) when work went below the batch's rung for a failure of its own, or a
failure that is no platform fault reached a service's wait: none of it may happen without a record or a bug to
blame. (A batch split at once by a conflict, ``SPLIT_BY_A_CONFLICT``, is contention, not a failure.)"""


class Isolation(Protocol[ItemT_contra, ResultT_co]):
    """What a service gives the ladder: how its items group, how a unit of them is handled, and its end."""

    def group_of(self, item: ItemT_contra) -> Hashable:
        """The saga or key ``item`` belongs to: items of one group stay together until the last rung."""
        ...

    async def handle(self, items: Sequence[ItemT_contra]) -> Sequence[ResultT_co]:
        """Handle ``items`` as one unit (all or nothing): one result per item, in order."""
        ...

    async def isolate(self, item: ItemT_contra, error: Exception) -> ResultT_co:
        """The service's own end for an item that failed every time alone (``error``: its last failure)."""
        ...


class _Failed(Exception):
    """A unit failed for a reason of its own (a RECORD fault, or conflicts beyond ``CONFLICT_RETRIES``), or lost to
    a concurrent writer where it is not retried (``conflict``: a batch of several groups)."""

    def __init__(self, error: Exception, conflict: bool = False) -> None:
        super().__init__(describe(error))
        self.error = error
        self.conflict = conflict


class IsolationLadder(Generic[ItemT, ResultT]):
    """Runs batches through ``target`` rung by rung (see the module); ``name`` names it in logs.

    ``concurrent_groups``: the groups of a failed batch are handled at once (each a unit of its own), else one
    after another in order. ``on_conflict`` is told of every conflict (e.g. a metric). ``span`` names the spans
    of each unit (of ``span_kind``) while spans are on: one per saga trace the service names in it.
    """

    def __init__(self, target: Isolation[ItemT, ResultT], name: str, poison_attempts: int, *, span: str,
                 span_kind: SpanKind = SpanKind.INTERNAL, concurrent_groups: bool = False,
                 conflict_retries: int = CONFLICT_RETRIES, on_conflict: Callable[[], None] | None = None) -> None:
        self._target = target
        self._span, self._span_kind = span, span_kind
        self._name = name
        self._attempts = max(1, poison_attempts)
        self._concurrent = concurrent_groups
        self._conflict_retries = max(1, conflict_retries)
        self._on_conflict = on_conflict

    async def run(self, items: Sequence[ItemT]) -> list[ResultT]:
        """One result per item, in order. Raises only what ``classify`` calls a PLATFORM fault (nothing of the
        batch is acknowledged: wait, then hand it over again), or a failure of the service's end itself."""
        groups: dict[Hashable, list[int]] = {}
        for index, item in enumerate(items):
            groups.setdefault(self._target.group_of(item), []).append(index)
        if len(groups) > 1:
            try:
                return list(await self._unit(lambda: self._target.handle(items), several_groups=True))
            except _Failed as failed:
                extra = {"ladder": self._name, "groups": len(groups), "items": len(items), "error": str(failed)}
                if failed.conflict:
                    log.info(SPLIT_BY_A_CONFLICT, extra=extra)
                else:
                    log.warning(GROUPS_ONE_BY_ONE, extra=extra)
        members = [[items[index] for index in indexes] for indexes in groups.values()]
        if self._concurrent:
            done = await asyncio.gather(*(self._group(group) for group in members))
        else:
            done = [await self._group(group) for group in members]
        results: dict[int, ResultT] = {}
        for indexes, group_results in zip(groups.values(), done, strict=True):
            results.update(zip(indexes, group_results, strict=True))
        return [results[index] for index in range(len(items))]

    async def _group(self, items: Sequence[ItemT]) -> list[ResultT]:
        if len(items) == 1:
            return [await self._alone(items[0])]
        try:
            return list(await self._unit(lambda: self._target.handle(items)))
        except _Failed as failed:
            log.warning(ITEMS_ONE_AT_A_TIME,
                        extra={"ladder": self._name, "items": len(items), "group": str(self._target.group_of(items[0])),
                               "error": str(failed)})
        return [await self._alone(item) for item in items]

    async def _alone(self, item: ItemT) -> ResultT:
        error: Exception | None = None
        for _ in range(self._attempts):
            try:
                [result] = await self._unit(lambda: self._target.handle([item]))
                return result
            except _Failed as failed:
                error = failed.error
        assert error is not None
        log.error(ISOLATING,
                  extra={"ladder": self._name, "group": str(self._target.group_of(item)), "attempts": self._attempts,
                         "error": describe(error)})
        try:
            return await self._unit(lambda: self._target.isolate(item, error))
        except _Failed as failed:  # the end itself failed: the caller tries the work again
            raise failed.error from None

    async def _unit(self, work: Callable[[], Awaitable[T]], several_groups: bool = False) -> T:
        """``work``, one unit; a conflict is retried at once (``several_groups``: not at all); _Failed when it
        fails for a reason of its own; a platform fault is raised as it is."""
        conflicts = 0
        while True:
            try:
                if tracing.tracer is None:  # spans off: not a call more per unit
                    return await work()
                spans = tracing.unit(self._span, self._span_kind)
                assert spans is not None
                with spans:
                    return await work()
            except Exception as error:
                fault = classify(error)
                if fault is Fault.PLATFORM:
                    raise
                if fault is Fault.CONFLICT:
                    self._conflicted()
                    conflicts += 1
                    if several_groups:
                        raise _Failed(error, conflict=True) from error
                    if conflicts < self._conflict_retries:
                        log.info("write conflict, retrying", extra={"ladder": self._name, "conflicts": conflicts})
                        continue
                raise _Failed(error) from error

    def _conflicted(self) -> None:
        if self._on_conflict is not None:
            self._on_conflict()


@dataclass
class _Outage:
    error: str
    since: float  # monotonic
    pauses: int = 0


class OutageWait:
    """The wait of one component of a service (``component``, e.g. "participant flight") while the platform is
    away: backoff from ``first_s`` doubling to ``max_s``, the fault logged once and reported to the service's
    health (``/ready`` names it; durable timers are held meanwhile), and its end logged with how long it took.

    A failure that is no platform fault and still reached the caller (the service's end itself failed) is
    waited on the same way, logged as an error: the work is handed over again rather than dropped.
    """

    def __init__(self, component: str, *, first_s: float = 0.1, max_s: float = 5.0,
                 health: Callable[[], ServiceHealth] = current_health) -> None:
        self.component = component
        self._first_s = first_s
        self._max_s = max_s
        self._health = health
        self._delay_s = first_s
        self._outage: _Outage | None = None

    @property
    def waiting(self) -> bool:
        """True between a ``pause`` and the next ``over``."""
        return self._outage is not None

    async def pause(self, error: BaseException, stop: asyncio.Event | None = None, **fields: object) -> None:
        """Wait before the work that failed with ``error`` is tried again (less when ``stop`` is set)."""
        what = describe(error)
        platform = classify(error) is Fault.PLATFORM
        outage = self._outage
        if outage is None or outage.error != what:
            extra = {"component": self.component, "error": what, "retry_in_s": round(self._delay_s, 3), **fields}
            if platform:
                log.warning("waiting out a platform fault", extra=extra)
            else:
                log.error(OUTSIDE_ISOLATION, extra=extra)
            self._outage = outage = _Outage(what, outage.since if outage else time.monotonic())
            self._health().waiting(self.component, what if platform else f"a failure: {what}")
        outage.pauses += 1
        delay, self._delay_s = self._delay_s, min(self._delay_s * 2, self._max_s)
        if stop is None:
            await asyncio.sleep(delay)
        elif not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), delay)
            except TimeoutError:
                pass

    def over(self) -> None:
        """The work went through: the outage (if any) is over."""
        self._delay_s = self._first_s
        outage, self._outage = self._outage, None
        if outage is not None:
            log.info("platform fault over, going on", extra={
                "component": self.component, "error": outage.error, "pauses": outage.pauses,
                "outage_s": round(time.monotonic() - outage.since, 3)})
            self._health().resumed(self.component)
