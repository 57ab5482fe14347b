"""Every service rides out a broker restart and a Postgres restart: no exit, no lost or wrong saga.

The whole system runs as processes on a private Kafka and Postgres; trip sagas of every scenario are started
before, during and after the restarts. Afterwards every saga ended as its scenario says (timers are held during
an outage, so the outage does not time steps out), ``verify_system`` finds nothing, no service exited, no
isolation ladder went below its batch (a restart is the platform's fault, never a record's), and each service
saw the outage and the recovery: on its health endpoint and in its log. (``test_restart_ladders.py`` restarts
Postgres at the moments that once sent healthy work down a ladder, every time; here the moments fall where the
load puts them.)
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.chaos_run import ChaosPlan, ChaosResult, ChaosRun
from bench.chaos_support import started_and_ready
from saga_orchestrator.cli.run_cmd import health_port
from saga_orchestrator.infra.health_server import fetch_health
from saga_orchestrator.infra.settings import Settings
from tests.chaos.conftest import private_stack_settings
from tests.conftest import module_stack
from tests.e2e.harness import Stack

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

Seen = dict[str, list[tuple[bool | None, bool | None]]]  # service → every (kafka_ok, postgres_ok) it reported


@pytest.fixture(scope="module")
def stack(private_servers: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    settings = private_stack_settings(private_servers, "restarts")
    log_dir: Path = tmp_path_factory.mktemp("restart-logs")
    yield from module_stack(started_and_ready(settings, log_dir), log_dir)


async def _watch_health(stack: Stack, seen: Seen, done: asyncio.Event) -> None:
    """Poll every service's /health, recording each (kafka_ok, postgres_ok) it reports."""
    settings = stack.settings
    while not done.is_set():
        for label in stack.labels:
            body = await fetch_health(settings.saga_health_host, health_port(settings, label), timeout_s=1)
            if body is not None:
                health = json.loads(body)
                seen.setdefault(label, []).append((health["kafka_ok"], health["postgres_ok"]))
        await asyncio.sleep(0.2)


async def _run(stack: Stack, servers: Settings, plan: ChaosPlan) -> tuple[ChaosResult, Seen]:
    seen: Seen = {}
    done = asyncio.Event()
    watcher = asyncio.create_task(_watch_health(stack, seen, done))
    try:
        result = await ChaosRun(stack, plan, servers=servers).run()
    finally:
        done.set()
        await watcher
    return result, seen


def _assert_all_ended_as_planned(result: ChaosResult, stack: Stack) -> None:
    assert result.report is not None
    assert result.report.ok, (result.report.not_terminal[:5], result.report.violations[:5])
    assert not result.ended_otherwise, (result.ended_otherwise, sorted(result.cancel_refused))
    assert not result.unexpected_exits and stack.exited() == {}, stack.exited()
    assert not result.isolation_steps, f"healthy work down an isolation ladder: {result.isolation_steps}"


async def _final_health(stack: Stack) -> dict[str, Any]:
    settings = stack.settings
    bodies = {label: await fetch_health(settings.saga_health_host, health_port(settings, label))
              for label in stack.labels}
    assert all(body is not None for body in bodies.values()), bodies
    return {label: json.loads(body) for label, body in bodies.items() if body is not None}


async def test_broker_restart_mid_run(stack: Stack, private_servers: Settings) -> None:
    plan = ChaosPlan(duration_s=15, rate=4, kill_every_s=0, broker_restart_every_s=15, db_restart_every_s=0,
                     outage_s=(2.0, 3.0), duplicates=False, drain_timeout_s=90)
    result, seen = await _run(stack, private_servers, plan)

    assert result.broker_restarts == 1 and len(result.scenario_of) >= 50
    _assert_all_ended_as_planned(result, stack)
    final = await _final_health(stack)
    for label in stack.labels:
        assert False in [kafka for kafka, _ in seen.get(label, [])], f"{label} never reported Kafka down"
        assert final[label]["kafka_ok"] is True, final[label]
        assert final[label]["dependencies"]["kafka"]["outages"] >= 1, final[label]
        log = stack.log(label)
        assert "kafka unavailable" in log and "kafka reachable again" in log, label


async def test_postgres_restarts_mid_run(stack: Stack, private_servers: Settings) -> None:
    plan = ChaosPlan(duration_s=24, rate=10, kill_every_s=0, broker_restart_every_s=0, db_restart_every_s=8,
                     outage_s=(0.0, 2.0), duplicates=False, drain_timeout_s=90)
    result, seen = await _run(stack, private_servers, plan)

    assert result.db_restarts == 3 and len(result.scenario_of) >= 200
    _assert_all_ended_as_planned(result, stack)
    final = await _final_health(stack)
    for label in stack.labels:
        assert False in [postgres for _, postgres in seen.get(label, [])], f"{label} never reported Postgres down"
        assert final[label]["postgres_ok"] is True, final[label]
        assert final[label]["dependencies"]["postgres"]["outages"] >= 1, final[label]
        log = stack.log(label)
        assert "postgres unavailable" in log and "postgres reachable again" in log, label
