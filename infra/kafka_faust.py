"""The participant workers' faust app, connected as every other Kafka client (``infra.kafka_clients``).

Apart from ``kafka_clients`` because it pulls in faust, which the client library must not.
"""

from __future__ import annotations

from typing import Any

import faust
from faust.types.auth import CredentialsT

from .kafka_admin import TopicLayout
from .kafka_clients import KafkaClients


def faust_credentials(kafka: KafkaClients) -> CredentialsT | None:
    """faust's form of ``kafka``'s security settings (None for PLAINTEXT)."""
    security = kafka.security
    options = kafka.connection_options()  # validated settings, shared TLS context and token provider
    context = options.get("ssl_context")
    if security.uses_sasl:
        if security.sasl_mechanism == "OAUTHBEARER":
            return faust.OAuthCredentials(oauth_cb=options["sasl_oauth_token_provider"], ssl_context=context)
        return faust.SASLCredentials(username=security.username, password=security.password, ssl_context=context,
                                     mechanism=security.sasl_mechanism)
    if context is not None:
        return faust.SSLCredentials(context)
    return None


def faust_app(ident: str, kafka: KafkaClients, layout: TopicLayout, **options: Any) -> faust.App:
    """A faust app (not started) named ``ident`` on ``kafka``'s cluster; the topics it declares get
    ``layout``'s replication factor, and are only checked, never created, when ``layout.create`` is off."""
    return faust.App(
        ident,
        broker=[f"kafka://{host}:{port}" for host, port in kafka.hosts()],
        broker_credentials=faust_credentials(kafka),
        topic_replication_factor=layout.replication_factor,
        topic_allow_declare=layout.create,
        # The leader-election topic serves app.timer(on_leader=True), which no worker uses; without it a
        # cluster whose topics are managed apart (SAGA_CREATE_TOPICS=false) needs none of faust's own.
        topic_disable_leader=True,
        **options,
    )
