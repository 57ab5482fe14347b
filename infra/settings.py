"""Settings shared by every service, read from environment variables (see the README's table)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from ..schemas.registry import DEFAULT_SCHEMA_PATH
from .kafka_admin import TopicLayout
from .kafka_clients import KafkaClients, KafkaSecurity

KAFKA_NODE_PORT_STEP = 10
"""Node k of a local cluster listens on the SAGA_KAFKA_* ports plus KAFKA_NODE_PORT_STEP * (k - 1)."""


class Settings(BaseSettings):
    """One place for every knob; each field is read from the upper-case environment variable."""

    model_config = SettingsConfigDict(env_prefix="", case_sensitive=False, extra="ignore")

    kafka_bootstrap_servers: str | None = Field(
        default=None, description="Kafka bootstrap servers; unset → the local launcher's broker."
    )
    saga_kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        default="PLAINTEXT", description="How every Kafka client connects: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.",
    )
    saga_kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"] | None = Field(
        default=None,
        description="SASL mechanism (SASL_* protocols): PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER.",
    )
    saga_kafka_sasl_username: str | None = Field(default=None, description="SASL user (PLAIN and SCRAM).")
    saga_kafka_sasl_password: SecretStr | None = Field(default=None, description="SASL password (PLAIN and SCRAM).")
    saga_kafka_oauth_token_provider: str | None = Field(
        default=None,
        description="OAUTHBEARER: module:attribute of an aiokafka AbstractTokenProvider (an instance, or a class "
                    "made with no arguments), e.g. one wrapping aws-msk-iam-sasl-signer for MSK IAM.",
    )
    saga_kafka_ssl_cafile: str | None = Field(
        default=None, description="TLS: CA bundle that signed the brokers' certificates (default: the system's).",
    )
    saga_kafka_ssl_certfile: str | None = Field(default=None, description="TLS: client certificate (mutual TLS).")
    saga_kafka_ssl_keyfile: str | None = Field(default=None, description="TLS: the client certificate's key.")
    saga_kafka_ssl_key_password: SecretStr | None = Field(default=None, description="TLS: the key's password.")
    saga_topic_replication_factor: int = Field(
        default=1, ge=1, description="Replicas of every topic the services create (3 on a production cluster).",
    )
    saga_topic_min_insync_replicas: int | None = Field(
        default=None, ge=1,
        description="min.insync.replicas of the topics the services create (unset: the broker's default); with "
                    "acks=all a write succeeds once this many replicas have it.",
    )
    saga_create_topics: bool = Field(
        default=True,
        description="Create missing topics at start. Off: check that they exist with SAGA_TOPIC_PARTITIONS "
                    "partitions and refuse to start, naming the missing ones (where topics are managed apart).",
    )
    database_url: str | None = Field(
        default=None, description="Postgres DSN; unset → the local launcher's database."
    )
    saga_topic_prefix: str = Field(default="", description="Prefix for every topic name.")
    saga_topic_partitions: int = Field(default=8, ge=1, description="Partitions of topics the services create.")
    saga_home: Path = Field(
        default=Path.home() / ".cache" / "saga-orchestrator",
        description="Local launcher folder: Kafka jars, data and log folders, Postgres data folder.",
    )
    saga_kafka_port: int = Field(default=19092, description="Local launcher: Kafka broker port.")
    saga_kafka_controller_port: int = Field(default=19093, description="Local launcher: KRaft controller port.")
    saga_kafka_brokers: int = Field(
        default=1, ge=1, le=9,
        description="Local launcher: brokers to run; more than one is a KRaft cluster on loopback, node k on "
                    "the ports below plus 10 * (k - 1) (`saga infra up --brokers 3`).",
    )
    saga_kafka_secure_port: int = Field(
        default=19094, description="Local launcher: the broker's SASL_SSL (SCRAM) listener port.",
    )
    saga_postgres_port: int = Field(default=15432, description="Local launcher: Postgres port.")
    saga_db_pool_size: int = Field(default=8, ge=1, description="Postgres connections per service.")
    saga_relay_poll_ms: float = Field(
        default=50, gt=0,
        description="Orchestrator's outbox relay: wait between polls while they keep finding rows (when idle "
                    "it grows to 50 ms, or this if longer). Higher: bigger batches, less CPU, more latency per step.",
    )
    saga_fetch_wait_ms: int = Field(
        default=75, ge=1,
        description="Orchestrator: the longest a Kafka fetch waits for more records before it returns.",
    )
    saga_fetch_pacing: Literal["adaptive", "fixed"] = Field(
        default="adaptive",
        description="Orchestrator: `adaptive` answers a fetch as soon as a record arrives while polls are small "
                    "and waits longer, up to SAGA_FETCH_WAIT_MS, as they grow (lowest latency); `fixed` waits "
                    "SAGA_FETCH_WAIT_MS whenever records flow (bigger batches at low rates: about half the CPU "
                    "per saga at 15 sagas/s, five times the latency).",
    )
    saga_inbox_retention_hours: float = Field(
        default=168, ge=0,
        description="Orchestrator: ids of handled messages (the inbox, which skips a redelivered message) are "
                    "deleted after this long; 0 keeps them. Keep it at least as long as the retention of the "
                    "topics the orchestrator reads.",
    )
    saga_retention_days: float = Field(
        default=0, ge=0,
        description="Orchestrator: sagas that ended this many days ago give up their events for one SagaPurged "
                    "(as `saga purge --ended-before`; checked every 10 minutes, never COMPENSATION_FAILED ones); "
                    "0 keeps every event.",
    )
    saga_compensation_alert_minutes: float = Field(
        default=15, gt=0,
        description="Orchestrator: a compensation still retrying this long after its first retry was scheduled "
                    "counts in saga_compensations_retrying_too_long (refreshed every few seconds).",
    )
    saga_participant_retention_hours: float = Field(
        default=168, ge=0,
        description="Participant: idempotency records (processed_commands) are deleted this long after their "
                    "command was handled; 0 keeps them. Keep it at least as long as the retention of the "
                    "<p>.commands topics.",
    )
    saga_participant_batch_ms: float = Field(
        default=25, gt=0,
        description="Participant worker: the longest it lets a batch of commands (one transaction) gather "
                    "after a batch of more than one, while the commands of a burst keep arriving (each within "
                    "2 ms of the last); after a batch of one it takes what has arrived at once.",
    )
    saga_draining: str = Field(
        default="",
        description="Orchestrator: saga type versions that take no new starts, comma-separated `type:version` "
                    "(e.g. `trip:2`, to stop starting a version found wanting while its sagas run to their end): "
                    "a new saga starts on the highest version not named; a StartSaga of a type whose every "
                    "version drains, or naming a draining version, is refused, saying so. `saga definitions` and "
                    "the console mark these versions draining.",
    )
    saga_allow_stranding: bool = Field(
        default=False,
        description="Orchestrator: start even when the definitions it registers would strand running sagas (their "
                    "version not deployed, or deployed with another shape); those sagas are quarantined at their "
                    "next message. Off: such a deploy is refused at start, one line per type, version and shape.",
    )
    saga_poison_attempts: int = Field(
        default=3, ge=1,
        description="How often a message that fails for no known reason is tried alone before its saga is "
                    "quarantined (orchestrator) or it is dead-lettered (participant worker); an unavailable "
                    "database or broker is waited out instead.",
    )
    saga_log_level: str = Field(default="INFO", description="Log level of every service.")
    saga_log_format: str = Field(default="json", description="Log line format: json or kv (key=value).")
    saga_app: str | None = Field(
        default=None,
        description="The deployment's app object (module:attribute of a SagaApp): its saga types, records and "
                    "participants, for every process (else `[tool.saga] app` in the working directory's "
                    "pyproject.toml). Unset: SAGA_DEFINITIONS, SAGA_SCHEMA_PATH and SAGA_PARTICIPANTS, as in 0.1. A "
                    "process that runs saga types refuses to start when neither this nor SAGA_DEFINITIONS names any.",
    )
    saga_definitions: str = Field(
        default="",
        description="Without SAGA_APP (as in 0.1): the saga definitions the deployment runs, comma-separated "
                    "module:attribute paths (the example trip: saga_orchestrator.participants.trip:TRIP).",
    )
    saga_schema_path: str = Field(
        default=DEFAULT_SCHEMA_PATH,
        description="Schema folders or packages (os.pathsep-separated) holding your saga types' input records "
                    "(default: the trip example's package).",
    )
    saga_health_port: int = Field(
        default=0, ge=0, le=65535,
        description="GET /health and /metrics on this port (0: off); `saga run all` gives each service its "
                    "own, counting up from this one.",
    )
    saga_health_host: str = Field(default="127.0.0.1", description="Address the health endpoint listens on.")
    saga_participants: str = Field(
        default="",
        description="Participant workers `saga run all` starts, comma-separated; each a name or module:attribute "
                    "path, or several joined by `+` for one worker hosting them all "
                    "(`flight+hotel+payment+notification`: one process). Unset: the app's participants, a "
                    "worker each (none without SAGA_APP).",
    )
    saga_console_levers: bool = Field(
        default=False,
        description="`saga console`: let operators pull levers (retry, skip, cancel, replay, bulk jobs...); off, "
                    "it only reads. On, it needs SAGA_CONSOLE_OPERATOR_HEADER or SAGA_CONSOLE_USERS.",
    )
    saga_console_operator_header: str | None = Field(
        default=None,
        description="`saga console` behind an authenticating proxy: the request header naming the operator "
                    "(e.g. X-Forwarded-User); a request without it is refused.",
    )
    saga_console_users: str | None = Field(
        default=None,
        description="`saga console`: a file of local logins (name:scrypt-hash lines, `saga console add-user`).",
    )
    saga_console_secret: SecretStr | None = Field(
        default=None,
        description="Deprecated since 0.2, unused: sign-ins are held in Postgres (saga.console_sessions) and end "
                    "at sign-out, so no key signs the session cookie.",
    )
    saga_console_secure_cookie: bool = Field(
        default=False,
        description="`saga console` served over HTTPS (a TLS-terminating proxy in front): its session cookie is "
                    "Secure and __Host- prefixed, so a browser sends it over HTTPS only.",
    )
    saga_console_behind_proxy: bool = Field(
        default=False,
        description="`saga console --host` an address other than loopback with SAGA_CONSOLE_OPERATOR_HEADER: "
                    "confirms that only the authenticating proxy can reach it (anyone else could name "
                    "themselves in the header). Refused to start without it.",
    )
    saga_api_url: str | None = Field(
        default=None,
        description="The console's HTTP API (e.g. http://127.0.0.1:8089): `SagaClient.status` and the CLI's "
                    "`status`, `history` and `list` read through it where DATABASE_URL is not set.",
    )
    saga_api_user: str | None = Field(default=None, description="A local login of the console (SAGA_API_URL).")
    saga_api_password: SecretStr | None = Field(default=None, description="Its password.")

    def kafka_servers(self) -> str:
        """The bootstrap servers to use: the environment's, else the local launcher's."""
        return self.kafka_bootstrap_servers or ",".join(
            f"127.0.0.1:{self.saga_kafka_port + KAFKA_NODE_PORT_STEP * node}"
            for node in range(self.saga_kafka_brokers))

    def kafka(self) -> KafkaClients:
        """The builder of every Kafka client: the bootstrap servers and the SAGA_KAFKA_* security settings."""
        return KafkaClients(self.kafka_servers(), KafkaSecurity(
            protocol=self.saga_kafka_security_protocol,
            sasl_mechanism=self.saga_kafka_sasl_mechanism,
            username=self.saga_kafka_sasl_username,
            password=_secret(self.saga_kafka_sasl_password),
            token_provider=self.saga_kafka_oauth_token_provider,
            ca_file=self.saga_kafka_ssl_cafile,
            cert_file=self.saga_kafka_ssl_certfile,
            key_file=self.saga_kafka_ssl_keyfile,
            key_password=_secret(self.saga_kafka_ssl_key_password),
        ))

    def topic_layout(self) -> TopicLayout:
        """How the services create (or, with SAGA_CREATE_TOPICS off, check) their topics."""
        return TopicLayout(self.saga_topic_partitions, self.saga_topic_replication_factor,
                           self.saga_topic_min_insync_replicas, self.saga_create_topics)

    def dsn(self) -> str:
        """The Postgres DSN to use: the environment's, else the local launcher's."""
        return self.database_url or f"postgresql://saga@127.0.0.1:{self.saga_postgres_port}/saga"

    def environment(self) -> dict[str, str | None]:
        """Every setting as the environment variable that reads it back into equal settings: its upper-case name
        to its text, None for one left unset. Secrets are in clear: this is for a child process's environment.
        KAFKA_BOOTSTRAP_SERVERS and DATABASE_URL are the resolved ones (``kafka_servers``, ``dsn``), so a child
        reaches the same local launcher."""
        values: dict[str, str | None] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, SecretStr):
                value = value.get_secret_value()
            values[name.upper()] = (None if value is None else ("true" if value else "false")
                                    if isinstance(value, bool) else str(value))
        values["KAFKA_BOOTSTRAP_SERVERS"] = self.kafka_servers()
        values["DATABASE_URL"] = self.dsn()
        return values


def _secret(value: SecretStr | None) -> str | None:
    return None if value is None else value.get_secret_value()
