"""``saga run all`` passes every setting on: a child service reads back exactly the settings of its parent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from saga_orchestrator.cli.run_cmd import service_environment
from saga_orchestrator.infra.settings import Settings

# A value other than the default for every setting: a setting added to Settings must be added here too.
CHANGED: dict[str, Any] = {
    "kafka_bootstrap_servers": "kafka-1:9092,kafka-2:9092", "saga_kafka_security_protocol": "SASL_SSL",
    "saga_kafka_sasl_mechanism": "SCRAM-SHA-512", "saga_kafka_sasl_username": "orchestrator",
    "saga_kafka_sasl_password": "sasl secret", "saga_kafka_oauth_token_provider": "shop.tokens:PROVIDER",
    "saga_kafka_ssl_cafile": "/etc/ca.pem", "saga_kafka_ssl_certfile": "/etc/cert.pem",
    "saga_kafka_ssl_keyfile": "/etc/key.pem", "saga_kafka_ssl_key_password": "key secret",
    "saga_topic_replication_factor": 3, "saga_topic_min_insync_replicas": 2, "saga_create_topics": False,
    "database_url": "postgresql://saga@db:5432/shop", "saga_topic_prefix": "shop.", "saga_topic_partitions": 12,
    "saga_home": Path("/var/lib/saga"), "saga_kafka_port": 29092, "saga_kafka_controller_port": 29093,
    "saga_kafka_brokers": 3, "saga_kafka_secure_port": 29094, "saga_postgres_port": 25432, "saga_db_pool_size": 4,
    "saga_relay_poll_ms": 12.5, "saga_fetch_wait_ms": 40, "saga_fetch_pacing": "fixed",
    "saga_inbox_retention_hours": 72.0, "saga_retention_days": 30.0, "saga_compensation_alert_minutes": 5.0,
    "saga_participant_retention_hours": 48.0, "saga_participant_batch_ms": 10.0, "saga_poison_attempts": 5,
    "saga_log_level": "DEBUG", "saga_log_format": "kv", "saga_app": "shop.saga:app",
    "saga_definitions": "shop.saga:CHECKOUT", "saga_schema_path": "/srv/shop/schemas",
    "saga_health_port": 9100, "saga_health_host": "0.0.0.0", "saga_participants": "inventory+billing,shipping",
    "saga_console_levers": True, "saga_console_operator_header": "X-Forwarded-User",
    "saga_console_users": "/etc/saga/users", "saga_console_secret": "console secret",
    "saga_console_secure_cookie": True, "saga_console_behind_proxy": True, "saga_allow_stranding": True,
    "saga_draining": "trip:1",
    "saga_api_url": "http://console:8089", "saga_api_user": "ivo", "saga_api_password": "api secret",
}

READ_BACK = """
import json
from pydantic import SecretStr
from saga_orchestrator.infra.settings import Settings
current = Settings()
print(json.dumps({name: (value.get_secret_value() if isinstance(value, SecretStr) else value)
                  for name, value in current.model_dump(mode="python").items()}, default=str))
"""


def _plain(settings: Settings) -> dict[str, Any]:
    """The settings as the child prints them: secrets in clear, through JSON."""
    values = {name: (value.get_secret_value() if hasattr(value, "get_secret_value") else value)
              for name, value in settings.model_dump(mode="python").items()}
    plain: dict[str, Any] = json.loads(json.dumps(values, default=str))
    return plain


def test_every_setting_has_a_changed_value_here() -> None:
    assert sorted(CHANGED) == sorted(Settings.model_fields)
    defaults = Settings.model_construct()
    assert [name for name, value in CHANGED.items() if getattr(defaults, name) == value] == []


def test_every_setting_reaches_a_child_service(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAGA_API_URL", "http://stale:1")  # the parent's environment loses to its settings
    monkeypatch.setenv("saga_topic_prefix", "stale.")  # in whatever case it is spelled
    parent = Settings(**CHANGED)
    child = subprocess.run([sys.executable, "-c", READ_BACK], env=service_environment(parent), check=True,
                           capture_output=True, text=True, timeout=60)
    assert json.loads(child.stdout) == _plain(parent)


def test_a_setting_left_unset_is_unset_in_the_child_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAGA_APP", "shop.saga:app")
    parent = Settings(saga_app=None, saga_api_url=None, saga_kafka_sasl_password=None)
    env = service_environment(parent)
    assert "SAGA_APP" not in env and "SAGA_API_URL" not in env and "SAGA_KAFKA_SASL_PASSWORD" not in env
