"""Every Kafka client of a deployment is built here, from the bootstrap servers and the security settings.

The services, the command line, the client library and the benches ask ``KafkaClients`` for producers,
consumers, admin clients and raw connections (the health probe), and ``infra.kafka_faust`` builds the
participant workers' faust app from the same settings, so a cluster that needs TLS or SASL is configured
once, in the environment (README, "Production"):

    SAGA_KAFKA_SECURITY_PROTOCOL  PLAINTEXT (default), SSL, SASL_PLAINTEXT or SASL_SSL
    SAGA_KAFKA_SASL_MECHANISM     PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER
    SAGA_KAFKA_SASL_USERNAME / SAGA_KAFKA_SASL_PASSWORD            PLAIN and SCRAM
    SAGA_KAFKA_OAUTH_TOKEN_PROVIDER  module:attribute of an aiokafka ``AbstractTokenProvider`` (OAUTHBEARER)
    SAGA_KAFKA_SSL_CAFILE, SAGA_KAFKA_SSL_CERTFILE, SAGA_KAFKA_SSL_KEYFILE, SAGA_KAFKA_SSL_KEY_PASSWORD

``tests/unit/test_kafka_clients.py`` fails when an aiokafka client or a faust app is built anywhere else in
the package or the benches.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.abc import AbstractTokenProvider
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.conn import AIOKafkaConnection, collect_hosts, create_conn
from aiokafka.errors import (
    AuthenticationFailedError,
    AuthenticationMethodNotSupported,
    IllegalSaslStateError,
    KafkaConnectionError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)
from aiokafka.helpers import create_ssl_context

from .misconfigured import Misconfigured
from .references import load_reference

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
_CREDENTIALS = "SAGA_KAFKA_SASL_USERNAME / SAGA_KAFKA_SASL_PASSWORD"
_REFUSED_SASL: tuple[type[BaseException], ...] = (
    SaslAuthenticationFailed, AuthenticationFailedError, AuthenticationMethodNotSupported,
    UnsupportedSaslMechanismError, IllegalSaslStateError,
)


class KafkaSetupError(Misconfigured):
    """The Kafka settings are wrong (no retry changes them): the message names the setting to fix."""


@dataclass(frozen=True)
class KafkaSecurity:
    """How clients authenticate to the brokers and encrypt the connection (see the module's docstring)."""

    protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    token_provider: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    key_password: str | None = field(default=None, repr=False)

    @property
    def uses_tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def problems(self) -> list[str]:
        """What is wrong with these settings, each naming the setting to fix; empty when they are usable."""
        if self.protocol not in SECURITY_PROTOCOLS:
            return [f"SAGA_KAFKA_SECURITY_PROTOCOL={self.protocol!r}: use one of {', '.join(SECURITY_PROTOCOLS)}"]
        found = []
        if self.uses_sasl:
            if self.sasl_mechanism not in SASL_MECHANISMS:
                found.append(f"SAGA_KAFKA_SASL_MECHANISM={self.sasl_mechanism or ''!r}: {self.protocol} needs one of "
                             f"{', '.join(SASL_MECHANISMS)}")
            elif self.sasl_mechanism == "OAUTHBEARER":
                if not self.token_provider:
                    found.append("SAGA_KAFKA_OAUTH_TOKEN_PROVIDER is not set: OAUTHBEARER needs the module:attribute "
                                 "of a token provider (an aiokafka AbstractTokenProvider)")
            elif not self.username or not self.password:
                found.append(f"{_CREDENTIALS}: {self.sasl_mechanism} needs both")
        elif self.sasl_mechanism or self.username:
            found.append(f"SAGA_KAFKA_SASL_MECHANISM / SAGA_KAFKA_SASL_USERNAME are set, but "
                         f"SAGA_KAFKA_SECURITY_PROTOCOL={self.protocol} does not use SASL: use SASL_SSL or "
                         "SASL_PLAINTEXT")
        if not self.uses_tls and (self.ca_file or self.cert_file or self.key_file):
            found.append(f"SAGA_KAFKA_SSL_* files are set, but SAGA_KAFKA_SECURITY_PROTOCOL={self.protocol} does not "
                         "use TLS: use SSL or SASL_SSL")
        if bool(self.cert_file) != bool(self.key_file):
            found.append("SAGA_KAFKA_SSL_CERTFILE and SAGA_KAFKA_SSL_KEYFILE go together (a client certificate "
                         "needs its key)")
        return found

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of every connection (None without TLS): the CA file's roots, else the system's."""
        if not self.uses_tls:
            return None
        try:
            context: ssl.SSLContext = create_ssl_context(cafile=self.ca_file, certfile=self.cert_file,
                                                         keyfile=self.key_file, password=self.key_password)
            return context
        except Exception as error:  # a file missing or unreadable, a PEM that is no certificate or key
            raise KafkaSetupError(f"cannot read the TLS files (SAGA_KAFKA_SSL_CAFILE={self.ca_file}, "
                                  f"SAGA_KAFKA_SSL_CERTFILE={self.cert_file}, SAGA_KAFKA_SSL_KEYFILE="
                                  f"{self.key_file}): {error}") from error

    def oauth_token_provider(self) -> AbstractTokenProvider | None:
        """The OAUTHBEARER token provider SAGA_KAFKA_OAUTH_TOKEN_PROVIDER names: an instance, or a class or
        factory called with no arguments."""
        if self.sasl_mechanism != "OAUTHBEARER" or not self.token_provider:
            return None
        try:
            found = load_reference(self.token_provider)
        except ValueError as error:
            raise KafkaSetupError(f"SAGA_KAFKA_OAUTH_TOKEN_PROVIDER: {error}") from None
        provider = found if isinstance(found, AbstractTokenProvider) or not callable(found) else found()
        if not isinstance(provider, AbstractTokenProvider):
            raise KafkaSetupError(f"SAGA_KAFKA_OAUTH_TOKEN_PROVIDER={self.token_provider} gives a "
                                  f"{type(provider).__name__}, not an aiokafka AbstractTokenProvider")
        return provider

    def options(self) -> dict[str, Any]:
        """The keyword arguments every aiokafka client and connection takes for these settings."""
        problems = self.problems()
        if problems:
            raise KafkaSetupError("; ".join(problems))
        options: dict[str, Any] = {"security_protocol": self.protocol}
        context = self.ssl_context()
        if context is not None:
            options["ssl_context"] = context
        if self.uses_sasl:
            options["sasl_mechanism"] = self.sasl_mechanism
            if self.sasl_mechanism == "OAUTHBEARER":
                options["sasl_oauth_token_provider"] = self.oauth_token_provider()
            else:
                options["sasl_plain_username"] = self.username
                options["sasl_plain_password"] = self.password
        return options


class KafkaClients:
    """Producers, consumers, admin clients and connections to one cluster, all with the same security.

    Options given to a builder are the caller's (acks, group, fetch sizes); the connection's (bootstrap
    servers, security) are this object's. The security options are built once, on first use, so a TLS
    context and a token provider are shared by every client this object builds.
    """

    def __init__(self, bootstrap_servers: str, security: KafkaSecurity | None = None) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.security = security or KafkaSecurity()
        self._options: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return f"KafkaClients({self.bootstrap_servers!r}, {self.security.protocol})"

    def connection_options(self) -> dict[str, Any]:
        """Bootstrap servers and security, as aiokafka's clients take them (KafkaSetupError when unusable)."""
        if self._options is None:
            self._options = self.security.options()
        return {"bootstrap_servers": self.bootstrap_servers, **self._options}

    def producer(self, **options: Any) -> AIOKafkaProducer:
        return AIOKafkaProducer(**self.connection_options(), **options)

    def consumer(self, *topics: str, **options: Any) -> AIOKafkaConsumer:
        return AIOKafkaConsumer(*topics, **self.connection_options(), **options)

    def admin(self, **options: Any) -> AIOKafkaAdminClient:
        return AIOKafkaAdminClient(**self.connection_options(), **options)

    @asynccontextmanager
    async def started_admin(self, **options: Any) -> AsyncIterator[AIOKafkaAdminClient]:
        """An admin client, started, and closed after the block."""
        admin = self.admin(**options)
        await admin.start()
        try:
            yield admin
        finally:
            await admin.close()

    def hosts(self) -> list[tuple[str, int]]:
        """The bootstrap servers as (host, port) pairs."""
        return [(host, port) for host, port, _ in collect_hosts(self.bootstrap_servers, randomize=False)]

    async def connection(self, host: str, port: int, **options: Any) -> AIOKafkaConnection:
        """A raw connection to one broker, authenticated as every other client (the health probe's)."""
        security = dict(self.connection_options())
        del security["bootstrap_servers"]
        return await create_conn(host, port, **security, **options)

    async def check(self, timeout_s: float = 10.0) -> None:
        """Connect to a bootstrap server once, as every client will. KafkaSetupError, naming the setting to
        fix, when the settings are unusable or a broker refused the credentials or the TLS handshake (no retry
        changes that); KafkaConnectionError (a transient error, to wait out) when no server answered."""
        errors = []
        for host, port in self.hosts():
            try:
                conn = await self.connection(host, port, request_timeout_ms=int(timeout_s * 1000))
            except Exception as error:
                # aiokafka raises a refusal as it is, or wraps what the handshake raised
                refusal = (error if isinstance(error, (*_REFUSED_SASL, ssl.SSLError))
                           else error.__cause__ or error.__context__)
                if isinstance(refusal, _REFUSED_SASL):
                    raise KafkaSetupError(self._refused(refusal)) from error
                if isinstance(refusal, ssl.SSLError):
                    raise KafkaSetupError(
                        f"the TLS handshake with the Kafka broker {host}:{port} failed ({refusal.reason or refusal}): "
                        f"check SAGA_KAFKA_SSL_CAFILE={self.security.ca_file} (the CA that signed the broker's "
                        f"certificate) and SAGA_KAFKA_SECURITY_PROTOCOL={self.security.protocol}") from error
                errors.append(f"{host}:{port}: {error!r}")  # refused, reset, timed out: not reachable now
                continue
            conn.close()
            return
        hint = ""
        if any("closed" in error for error in errors):  # TLS or SASL expected where we spoke something else
            hint = (f"; a broker that closes the connection at once may expect another "
                    f"SAGA_KAFKA_SECURITY_PROTOCOL than {self.security.protocol}")
        raise KafkaConnectionError(f"no Kafka bootstrap server answered ({'; '.join(errors) or 'none given'}){hint}")

    def _refused(self, error: BaseException) -> str:
        mechanism = self.security.sasl_mechanism
        if isinstance(error, UnsupportedSaslMechanismError | AuthenticationMethodNotSupported):
            return (f"the Kafka brokers at {self.bootstrap_servers} do not accept SAGA_KAFKA_SASL_MECHANISM="
                    f"{mechanism} ({error})")
        what = "SAGA_KAFKA_OAUTH_TOKEN_PROVIDER's token" if mechanism == "OAUTHBEARER" else _CREDENTIALS
        user = f" for user {self.security.username!r}" if self.security.username else ""
        return (f"the Kafka brokers at {self.bootstrap_servers} refused the {mechanism} credentials{user}: "
                f"check {what} ({error})")
