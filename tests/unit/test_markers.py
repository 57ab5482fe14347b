"""The markers say what a test needs: ``-m "not integration and not e2e and not chaos"`` selects no test that
reaches a real Kafka or Postgres, and ``-m "not e2e"`` leaves out the 2,000-saga files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REAL = ["tests/infra", "tests/integration", "tests/e2e", "tests/chaos", "tests/browser"]
# The tests in these folders that need no server: a launcher's log read, a broker at port 1 (twice).
NEED_NO_SERVER = [
    "tests/infra/test_launcher.py::test_a_servers_own_words_for_a_port_it_could_not_bind_are_found_in_its_log",
    "tests/integration/test_health_probe.py::test_an_unreachable_broker_is_reported_with_the_reason",
    "tests/integration/test_topic_attendance.py::test_a_broker_that_does_not_answer_leaves_every_topic_unknown"]


def test_the_pure_selection_reaches_no_real_service_and_not_e2e_leaves_out_the_thousands_of_sagas() -> None:
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly",
                           "-p", "no:cacheprovider", "-p", "tests.unit.marker_report", *REAL],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    marks = {test: set(names.split(",")) - {"-"} for names, _, test in
             (line.removeprefix("MARKS ").partition(" ") for line in done.stdout.splitlines()
              if line.startswith("MARKS "))}
    assert len(marks) > 100
    pure = [test for test, names in marks.items() if not names & {"integration", "e2e", "chaos"}]
    assert pure == NEED_NO_SERVER
    thousands = [test for test in marks if "test_scale_out" in test or "test_cluster" in test]
    assert thousands and all({"e2e", "slow"} <= marks[test] for test in thousands)
