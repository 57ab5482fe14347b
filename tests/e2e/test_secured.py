"""The whole system over TLS and SASL: the demo's sagas through the local broker's SASL_SSL (SCRAM) listener,
and a refused password stops a service at start with a message naming the settings.

Only the secure port is given as bootstrap server: that listener speaks nothing but SASL_SSL, and the
metadata it returns names the SASL_SSL addresses, so every client of every service (the orchestrator's, the
faust workers', their relays', the CLI's) must have connected with the security settings for a saga to end.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from saga_orchestrator.infra.launcher.kafka import KafkaLauncher
from saga_orchestrator.infra.settings import Settings

pytestmark = pytest.mark.timeout(300)


def _secured_environment(launcher_settings: Settings, database_url: str, topic_prefix: str,
                         **overrides: str) -> dict[str, str]:
    kafka = KafkaLauncher(launcher_settings)
    env = {key: value for key, value in os.environ.items() if not key.startswith("SAGA_KAFKA_")}
    env.update(kafka.secrets.client_environment(kafka.secure_bootstrap))
    env.update({"DATABASE_URL": database_url, "SAGA_TOPIC_PREFIX": f"{topic_prefix}secured.",
                "SAGA_HOME": str(launcher_settings.saga_home), "SAGA_LOG_FORMAT": "kv", **overrides})
    return env


def test_the_demo_runs_over_sasl_ssl(launcher_settings: Settings, database_url: str, topic_prefix: str) -> None:
    env = _secured_environment(launcher_settings, database_url, topic_prefix)
    assert env["KAFKA_BOOTSTRAP_SERVERS"] != launcher_settings.kafka_servers()
    demo = subprocess.run([sys.executable, "-m", "saga_orchestrator.cli", "demo"], env=env, capture_output=True,
                          text=True, timeout=240)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "20 as expected, 0 not" in demo.stdout, demo.stdout[-3000:]


def test_a_wrong_password_stops_the_service_with_the_setting_named(
        launcher_settings: Settings, database_url: str, topic_prefix: str) -> None:
    env = _secured_environment(launcher_settings, database_url, topic_prefix,
                               SAGA_KAFKA_SASL_PASSWORD="not-the-password")
    service = subprocess.run([sys.executable, "-m", "saga_orchestrator.cli", "run", "orchestrator"], env=env,
                             capture_output=True, text=True, timeout=120)
    output = " ".join((service.stdout + service.stderr).split())  # the error is wrapped to the terminal width
    assert service.returncode != 0, output[-3000:]
    assert "refused the SCRAM-SHA-256 credentials for user 'saga'" in output, output[-3000:]
    assert "SAGA_KAFKA_SASL_USERNAME / SAGA_KAFKA_SASL_PASSWORD" in output, output[-3000:]
    assert "not-the-password" not in output


def test_plaintext_against_the_secured_listener_is_refused(
        launcher_settings: Settings, database_url: str, topic_prefix: str) -> None:
    env = _secured_environment(launcher_settings, database_url, topic_prefix)
    for key in [key for key in env if key.startswith("SAGA_KAFKA_")]:
        del env[key]
    client = subprocess.run([sys.executable, "-m", "saga_orchestrator.cli", "dlq", "list", "--live"],
                            env=env, capture_output=True, text=True, timeout=120)
    assert client.returncode != 0
    assert "cannot reach Kafka" in client.stdout + client.stderr
