"""One place builds every Kafka client: the security settings reach each of them, and nothing else builds one."""

from __future__ import annotations

import ast
import re
import ssl
from pathlib import Path

import faust
import pytest
from aiokafka.abc import AbstractTokenProvider

from saga_orchestrator.infra.kafka_admin import TopicLayout
from saga_orchestrator.infra.kafka_clients import KafkaClients, KafkaSecurity, KafkaSetupError
from saga_orchestrator.infra.kafka_faust import faust_app, faust_credentials
from saga_orchestrator.infra.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ["orchestrator", "outbox", "participants", "schemas", "infra", "cli", "client", "bench"]
FACTORIES = {"infra/kafka_clients.py", "infra/kafka_faust.py"}
CONSTRUCTORS = {"AIOKafkaProducer", "AIOKafkaConsumer", "AIOKafkaAdminClient", "AIOKafkaClient", "create_conn", "App"}


def constructions(path: Path) -> list[str]:
    """Calls in ``path`` that build a Kafka client or a faust app directly."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name in CONSTRUCTORS:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}(...)")
    return found


def test_no_kafka_client_is_built_outside_the_factory() -> None:
    built = [site for part in SCANNED for path in sorted((ROOT / part).rglob("*.py"))
             if str(path.relative_to(ROOT)) not in FACTORIES for site in constructions(path)]
    assert built == [], ("build these through infra.kafka_clients.KafkaClients (or infra.kafka_faust):\n"
                         + "\n".join(built))


def test_the_scan_sees_a_direct_construction(tmp_path: Path) -> None:
    # the guard above would pass on a scan that never matches: show that it matches both spellings
    sample = ROOT / "build" / "scan_sample.py"
    sample.parent.mkdir(exist_ok=True)
    sample.write_text("import aiokafka, faust\nx = aiokafka.AIOKafkaProducer(bootstrap_servers='a:1')\n"
                      "y = faust.App('id')\n")
    try:
        assert [site.split(" ")[1] for site in constructions(sample)] == ["AIOKafkaProducer(...)", "App(...)"]
    finally:
        sample.unlink()


def test_plaintext_is_the_default() -> None:
    assert KafkaClients("a:9092").connection_options() == {"bootstrap_servers": "a:9092",
                                                          "security_protocol": "PLAINTEXT"}


async def test_scram_over_tls_reaches_every_client() -> None:
    kafka = KafkaClients("a:9092,b:9093", KafkaSecurity(protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
                                                        username="orders", password="s3cret"))
    options = kafka.connection_options()
    assert options["security_protocol"] == "SASL_SSL"
    assert options["sasl_mechanism"] == "SCRAM-SHA-512"
    assert (options["sasl_plain_username"], options["sasl_plain_password"]) == ("orders", "s3cret")
    assert isinstance(options["ssl_context"], ssl.SSLContext)
    assert options["ssl_context"].verify_mode == ssl.CERT_REQUIRED
    producer, consumer, admin = kafka.producer(), kafka.consumer("t"), kafka.admin()
    assert producer.client._security_protocol == "SASL_SSL"
    assert consumer._client._sasl_plain_username == "orders"
    assert admin._client._sasl_mechanism == "SCRAM-SHA-512"
    assert kafka.hosts() == [("a", 9092), ("b", 9093)]
    assert "s3cret" not in repr(kafka.security)


@pytest.mark.parametrize(("security", "named"), [
    (KafkaSecurity(protocol="SASL_SSL"), "SAGA_KAFKA_SASL_MECHANISM"),
    (KafkaSecurity(protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-256", username="u"), "SAGA_KAFKA_SASL_PASSWORD"),
    (KafkaSecurity(protocol="SASL_PLAINTEXT", sasl_mechanism="OAUTHBEARER"), "SAGA_KAFKA_OAUTH_TOKEN_PROVIDER"),
    (KafkaSecurity(protocol="PLAINTEXT", sasl_mechanism="PLAIN", username="u", password="p"),
     "SAGA_KAFKA_SECURITY_PROTOCOL=PLAINTEXT does not use SASL"),
    (KafkaSecurity(protocol="PLAINTEXT", ca_file="/ca.pem"), "does not use TLS"),
    (KafkaSecurity(protocol="SSL", cert_file="/client.pem"), "SAGA_KAFKA_SSL_KEYFILE"),
    (KafkaSecurity(protocol="TLS"), "SAGA_KAFKA_SECURITY_PROTOCOL='TLS'"),
])
def test_unusable_settings_name_the_setting(security: KafkaSecurity, named: str) -> None:
    with pytest.raises(KafkaSetupError, match=re.escape(named)):
        KafkaClients("a:9092", security).connection_options()


def test_an_unreadable_ca_file_names_the_setting(tmp_path: Path) -> None:
    security = KafkaSecurity(protocol="SSL", ca_file=str(tmp_path / "missing.pem"))
    with pytest.raises(KafkaSetupError, match="SAGA_KAFKA_SSL_CAFILE"):
        KafkaClients("a:9092", security).connection_options()


class StaticToken(AbstractTokenProvider):  # type: ignore[misc]  # aiokafka.abc is untyped
    async def token(self) -> str:
        return "header.payload.signature"


def test_the_oauth_token_provider_is_loaded_by_reference() -> None:
    security = KafkaSecurity(protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER",
                             token_provider=f"{__name__}:StaticToken")
    options = KafkaClients("a:9092", security).connection_options()
    assert isinstance(options["sasl_oauth_token_provider"], StaticToken)
    assert "sasl_plain_username" not in options
    not_a_provider = KafkaSecurity(protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER", token_provider="os:sep")
    with pytest.raises(KafkaSetupError, match="not an aiokafka AbstractTokenProvider"):
        KafkaClients("a:9092", not_a_provider).connection_options()


def test_settings_read_the_security_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "k1:9094")
    monkeypatch.setenv("SAGA_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("SAGA_KAFKA_SASL_MECHANISM", "SCRAM-SHA-256")
    monkeypatch.setenv("SAGA_KAFKA_SASL_USERNAME", "saga")
    monkeypatch.setenv("SAGA_KAFKA_SASL_PASSWORD", "pw")
    monkeypatch.setenv("SAGA_TOPIC_REPLICATION_FACTOR", "3")
    monkeypatch.setenv("SAGA_TOPIC_MIN_INSYNC_REPLICAS", "2")
    monkeypatch.setenv("SAGA_CREATE_TOPICS", "false")
    settings = Settings()
    kafka = settings.kafka()
    assert kafka.bootstrap_servers == "k1:9094"
    assert kafka.security == KafkaSecurity(protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-256", username="saga",
                                           password="pw")
    assert settings.topic_layout() == TopicLayout(8, replication_factor=3, min_insync_replicas=2, create=False)
    assert settings.topic_layout().configs() == {"min.insync.replicas": "2"}
    assert "pw" not in repr(settings)


def test_faust_gets_the_same_security() -> None:
    scram = KafkaClients("a:9092", KafkaSecurity(protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
                                                 username="u", password="p"))
    credentials = faust_credentials(scram)
    assert isinstance(credentials, faust.SASLCredentials)
    assert (credentials.protocol.value, credentials.mechanism.value) == ("SASL_SSL", "SCRAM-SHA-512")
    assert (credentials.username, credentials.password) == ("u", "p")
    assert isinstance(faust_credentials(KafkaClients("a:9092", KafkaSecurity(protocol="SSL"))), faust.SSLCredentials)
    assert faust_credentials(KafkaClients("a:9092")) is None
    app = faust_app("creds-check", scram, TopicLayout(4, replication_factor=3, create=False))
    assert isinstance(app.conf.broker_credentials, faust.SASLCredentials)
    assert app.conf.broker_credentials.username == "u"
    assert app.conf.topic_replication_factor == 3
    assert app.conf.topic_allow_declare is False
    assert [str(url) for url in app.conf.broker] == ["kafka://a:9092"]
