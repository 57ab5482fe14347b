"""Local Kafka and Postgres without Docker: `up`, `down`, `status`, and restart helpers for fault tests."""

from .process import LauncherError
from .stack import (
    Endpoints,
    ServiceStatus,
    down,
    kill_kafka,
    restart_kafka,
    restart_postgres,
    start_kafka,
    start_postgres,
    status,
    stop_kafka,
    stop_postgres,
    up,
)

__all__ = [
    "Endpoints",
    "LauncherError",
    "ServiceStatus",
    "down",
    "kill_kafka",
    "restart_kafka",
    "restart_postgres",
    "start_kafka",
    "start_postgres",
    "status",
    "stop_kafka",
    "stop_postgres",
    "up",
]
