"""Fault injection: SAGA_FAULTS parsing, hit counting, and a real kill -9 of a child process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from saga_orchestrator.infra import faults


@pytest.fixture
def kills() -> Iterator[list[tuple[str, int]]]:
    recorded: list[tuple[str, int]] = []
    faults.arm("", kill=lambda name, hit: recorded.append((name, hit)))
    yield recorded
    faults.arm("")


def test_parse_nth_and_probability() -> None:
    parsed = faults.parse_faults(" orchestrator.after_commit=3, relay.after_publish@p0.25,x=@p1 ,")
    assert parsed["orchestrator.after_commit"].nth == 3
    assert parsed["relay.after_publish"].probability == 0.25
    assert parsed["x"].probability == 1.0
    assert faults.parse_faults("") == {}


@pytest.mark.parametrize("spec", ["a", "a=0", "a=x", "=2", "a@pz", "a@p1.5"])
def test_bad_specs_are_refused_with_the_item(spec: str) -> None:
    with pytest.raises(ValueError, match="SAGA_FAULTS"):
        faults.parse_faults(spec)


def test_fires_on_the_nth_hit_only(kills: list[tuple[str, int]]) -> None:
    faults.arm("p=3", kill=lambda name, hit: kills.append((name, hit)))
    for _ in range(5):
        faults.crash_point("p")
        faults.crash_point("other")
    assert kills == [("p", 3)]


def test_probability_draws_each_hit() -> None:
    trigger = faults.Trigger(probability=0.5)
    draws = iter([0.9, 0.1, 0.7])
    assert [trigger.hit(lambda: next(draws)) for _ in range(3)] == [False, True, False]


def test_unarmed_crash_points_do_nothing(kills: list[tuple[str, int]]) -> None:
    for _ in range(3):
        faults.crash_point("orchestrator.after_commit")
    assert kills == []


def test_a_fired_crash_point_kills_the_process_with_sigkill() -> None:
    code = ("from infra.faults import crash_point\n"
            "for i in range(5):\n"
            "    print(i, flush=True)\n"
            "    crash_point('demo.point')\n")
    env = {**os.environ, "SAGA_FAULTS": "demo.point=2"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == -signal.SIGKILL
    assert done.stdout.split() == ["0", "1"]
    assert "kill -9 at crash point demo.point" in done.stderr
