"""When a relay renews, gives back or retries its shard leases, and how long it trusts them (no I/O)."""

from __future__ import annotations

from saga_orchestrator.outbox.lease import ShardLeases


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def held(clock: Clock, epochs: dict[int, int]) -> ShardLeases:
    leases = ShardLeases("saga.outbox", clock=clock, renew_every_s=2.0, retry_every_s=1.0, trust_s=6.0)
    leases.epochs = dict(epochs)
    leases.renewed_at = clock.now
    return leases


def test_nothing_is_due_between_renewals_while_every_wanted_shard_is_held() -> None:
    clock = Clock()
    leases = held(clock, {0: 1, 1: 1})
    clock.now += 1.9
    assert not leases.due({0, 1})
    clock.now += 0.1
    assert leases.due({0, 1})


def test_a_shard_no_longer_wanted_is_given_back_at_once() -> None:
    clock = Clock()
    leases = held(clock, {0: 1, 1: 1})
    assert leases.due({0})
    assert leases.due(set())


def test_a_missing_shard_is_tried_for_again_after_the_retry_interval_only() -> None:
    clock = Clock()
    leases = held(clock, {0: 1})
    clock.now += 0.5
    assert not leases.due({0, 1})
    clock.now += 0.5
    assert leases.due({0, 1})


def test_leases_are_trusted_for_the_trust_window_after_a_renewal_began_and_never_when_none_is_held() -> None:
    clock = Clock()
    leases = held(clock, {0: 3})
    clock.now += 5.9
    assert leases.trusted()
    clock.now += 0.1
    assert not leases.trusted()
    assert not held(clock, {}).trusted()
    leases.forget()
    assert leases.epochs == {} and leases.locked == set() and not leases.trusted()
