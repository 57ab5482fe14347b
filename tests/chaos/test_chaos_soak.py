"""A minute of chaos: kill -9 of every service, a broker restart, a Postgres restart, duplicates everywhere.

The short version of ``python -m bench.chaos``: trip sagas of every scenario keep starting while the chaos
goes on; afterwards no saga is lost (every started one ended), ``verify_system`` finds no broken invariant,
no service exited unless it was killed, and no isolation ladder went below its batch (the chaos holds no
poison).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.chaos_run import ChaosPlan, ChaosRun
from bench.chaos_support import started_and_ready
from saga_orchestrator.infra.settings import Settings
from tests.chaos.conftest import private_stack_settings
from tests.conftest import module_stack
from tests.e2e.harness import Stack

pytestmark = [pytest.mark.chaos, pytest.mark.slow]


@pytest.fixture(scope="module")
def stack(private_servers: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    settings = private_stack_settings(private_servers, "soak")
    log_dir: Path = tmp_path_factory.mktemp("soak-logs")
    yield from module_stack(started_and_ready(settings, log_dir), log_dir)


@pytest.mark.timeout(400)
async def test_a_minute_of_chaos_loses_nothing(stack: Stack, private_servers: Settings) -> None:
    plan = ChaosPlan(duration_s=60, rate=3, kill_every_s=7, broker_restart_every_s=60, db_restart_every_s=60,
                     outage_s=(0.5, 2.0), duplicates=True, seed=7, drain_timeout_s=180)

    result = await ChaosRun(stack, plan, servers=private_servers).run()

    assert result.report is not None
    assert result.lost == [], result.lost[:10]
    assert result.report.violations == [], result.report.violations[:10]
    assert not result.unexpected_exits, result.unexpected_exits
    assert not result.isolation_steps, f"healthy work down an isolation ladder: {result.isolation_steps}"
    assert stack.exited() == {}
    assert set(result.kills) == set(stack.labels), result.kills  # every service was killed at least once
    assert result.broker_restarts == 1 and result.db_restarts == 1
    assert result.duplicates_injected > 0
    assert len(result.scenario_of) >= 150
    print(f"{len(result.scenario_of)} sagas, kills {dict(result.kills)}, {result.duplicates_injected} duplicates, "
          f"terminal {result.report.terminal}, drain {result.drain_s:.1f} s")
