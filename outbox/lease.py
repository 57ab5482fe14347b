"""Leases on outbox shards: which relay may publish which rows, with a fencing epoch.

An outbox table's rows are split into shards (``shard`` column: the orchestrator writes its saga's partition,
a participant 0). A relay publishes a shard's rows only while it holds the shard's lease, a row of
``<table>_leases``: holder, epoch, expiry (Postgres's clock). The holder renews it every ``RENEW_EVERY_S``;
another relay takes it over when it has expired, or at once when the holder's session is gone, and the epoch
goes up by one at every change of holder.

Why a lease and not only a session's advisory lock: a host cut off from the network without its connections
being closed keeps its session, and the lock, until Postgres notices (the TCP keepalive time, two hours by
default, or never behind a proxy that keeps its own end open); every row of the table would wait that long.

A zombie, a holder that lost its lease without noticing, publishes nothing after a standby took over:

- It trusts its leases for ``TRUST_S`` after a renewal *began* (local monotonic clock), shorter than the
  ``TTL_S`` Postgres gives them from a moment after that, and hands nothing to Kafka past its trust. A
  standby can take an expired lease only ``TTL_S`` after the last renewal; the difference covers clock rates
  and a reply that came late.
- Every read of rows joins the lease with the holder's epoch (``fenced_rows_sql``): a holder that comes back
  from a pause or a reconnect reads none of a shard someone else took.
- The fast path: a holder also keeps a session-level advisory lock per shard on its connection. A standby that
  gets that lock knows the holder's session ended (the process died or closed the connection, which it does only
  after forgetting its leases), so it takes the lease without waiting for the expiry. The lock connection asks
  Postgres for short keepalives (``KEEPALIVE_SETTINGS``), whose detection of a dead peer takes longer than the
  holder's trust, so a session Postgres ends for silence cannot hand the fast path a live zombie's shard.

The one residual window: a batch handed to the producer just before the trust ran out may take a Kafka round
trip (and the producer's retries, if Kafka is failing) to land.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import asyncpg

from ..infra.db import check_table

log = logging.getLogger(__name__)

TTL_S = 10.0
"""How long Postgres keeps a lease after a renewal; a standby takes it over once this has passed."""
RENEW_EVERY_S = 2.0
"""How often the holder renews its leases (between passes; a pass is milliseconds)."""
TRUST_S = 6.0
"""How long the holder trusts its leases after a renewal began: shorter than ``TTL_S`` by a margin."""
STATEMENT_TIMEOUT_S = 4.0
"""The longest any relay statement may take: a silently dropped connection is noticed within the trust."""
KEEPALIVE_SETTINGS = {"tcp_keepalives_idle": "5", "tcp_keepalives_interval": "2", "tcp_keepalives_count": "3",
                      "tcp_user_timeout": "11000"}
"""Postgres ends a lock session whose peer went silent after 11 s at the soonest: later than ``TRUST_S``."""


def leases_table(table: str) -> str:
    """The leases table of outbox ``table`` (``<schema>.outbox`` -> ``<schema>.outbox_leases``)."""
    return f"{check_table(table)}_leases"


def shard_lock_key(table: str, shard: int) -> int:
    """The advisory-lock key of ``table``'s ``shard``: a stable signed 64-bit hash."""
    digest = hashlib.blake2b(f"outbox-relay:{table}:{shard}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


@dataclass
class ShardLeases:
    """The leases one relay holds on ``table``'s shards, and until when it trusts them.

    ``refresh`` is the only statement that changes them: it gives back the shards no longer wanted, renews the
    rest and takes the wanted ones that are free. Forget them (``forget``) before the connection that holds the
    advisory locks is closed or dropped."""

    table: str
    holder: str = field(default_factory=lambda: uuid.uuid4().hex)
    clock: Callable[[], float] = time.monotonic
    ttl_s: float = TTL_S
    trust_s: float = TRUST_S
    renew_every_s: float = RENEW_EVERY_S
    retry_every_s: float = 1.0  # how often to try again for wanted shards someone else holds
    epochs: dict[int, int] = field(default_factory=dict)  # shard -> the epoch this holder took it at
    locked: set[int] = field(default_factory=set)  # shards whose advisory lock this holder's session holds
    renewed_at: float = float("-inf")  # when the last renewal began (the leases are trusted from it on)

    def __post_init__(self) -> None:
        self._leases = leases_table(self.table)
        # Take a shard that is free, expired, ours, or whose holder's session is gone (we got its lock and it
        # had it); the epoch goes up when the holder changes.
        self._take_sql = f"""
            INSERT INTO {self._leases} AS l (shard, holder, epoch, locked, expires_at)
            SELECT w.shard, $1, 1, w.shard = ANY($3::int[]), now() + make_interval(secs => $4)
            FROM unnest($2::int[]) AS w(shard) ORDER BY w.shard
            ON CONFLICT (shard) DO UPDATE
               SET epoch = CASE WHEN l.holder = excluded.holder THEN l.epoch ELSE l.epoch + 1 END,
                   holder = excluded.holder, locked = excluded.locked, expires_at = excluded.expires_at
             WHERE l.holder = excluded.holder OR l.expires_at < now()
                OR (l.locked AND l.shard = ANY($5::int[]))
            RETURNING shard, epoch"""
        self._lock_sql = ("SELECT w.shard FROM unnest($1::int[], $2::bigint[]) AS w(shard, lock_key)"
                          " WHERE pg_try_advisory_lock(w.lock_key)")
        self._give_back_sql = (f"UPDATE {self._leases} SET expires_at = '-infinity'"
                               " WHERE holder = $1 AND shard = ANY($2::int[])")
        self._unlock_sql = "SELECT count(pg_advisory_unlock(k)) FROM unnest($1::bigint[]) AS k"

    @property
    def shards(self) -> list[int]:
        """The shards held, in order."""
        return sorted(self.epochs)

    def trusted(self) -> bool:
        """True while the leases may be used to hand records to Kafka."""
        return bool(self.epochs) and self.clock() < self.renewed_at + self.trust_s

    def due(self, wanted: Collection[int]) -> bool:
        """True when ``refresh`` should run: a held shard is no longer wanted, the renewal is due, or a wanted
        shard is missing and ``retry_every_s`` passed since the last try."""
        held, wanted = set(self.epochs), set(wanted)
        if held - wanted:
            return True
        since = self.clock() - self.renewed_at
        return since >= self.renew_every_s or (bool(wanted - held) and since >= self.retry_every_s)

    async def refresh(self, conn: asyncpg.Connection, wanted: Collection[int], timeout_s: float) -> None:
        """Give back held shards not in ``wanted``, renew the others, take the wanted ones that are free."""
        started = self.clock()
        wanted = set(wanted)
        dropped = set(self.epochs) - wanted
        if dropped:
            await self.give_back(conn, dropped, timeout_s)
        fast: list[int] = []
        unlocked = sorted(wanted - self.locked)
        if unlocked:
            fast = [row["shard"] for row in await conn.fetch(
                self._lock_sql, unlocked, [shard_lock_key(self.table, s) for s in unlocked], timeout=timeout_s)]
            self.locked.update(fast)
        rows = await conn.fetch(self._take_sql, self.holder, sorted(wanted), sorted(self.locked), self.ttl_s,
                                fast, timeout=timeout_s)
        taken = {row["shard"]: row["epoch"] for row in rows}
        if new := {str(shard): epoch for shard, epoch in sorted(taken.items()) if self.epochs.get(shard) != epoch}:
            log.info("outbox shards taken", extra={"table": self.table, "epochs": new})
        if lost := sorted(set(self.epochs) - set(taken)):
            log.warning("outbox shards lost to another relay",
                        extra={"table": self.table, "epochs": {str(shard): self.epochs[shard] for shard in lost}})
        self.epochs = taken
        self.renewed_at = started

    async def give_back(self, conn: asyncpg.Connection, shards: Collection[int], timeout_s: float) -> None:
        """Expire the leases of ``shards`` at once, then free their advisory locks: the next relay takes them
        without waiting."""
        shards = sorted(shards)
        for shard in shards:  # forgotten first: nothing of these shards goes out from here on
            self.epochs.pop(shard, None)
        await conn.execute(self._give_back_sql, self.holder, shards, timeout=timeout_s)
        unlock = [shard for shard in shards if shard in self.locked]
        if unlock:
            await conn.fetchval(self._unlock_sql, [shard_lock_key(self.table, s) for s in unlock], timeout=timeout_s)
            self.locked.difference_update(unlock)
        log.info("outbox shards given back", extra={"table": self.table, "shards": shards})

    def forget(self) -> None:
        """Drop every lease from memory (the connection holding the locks is about to go)."""
        self.epochs.clear()
        self.locked.clear()
        self.renewed_at = float("-inf")
