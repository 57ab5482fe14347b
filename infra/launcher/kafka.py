"""Local Kafka: a single-node KRaft broker+controller from Maven Central jars, run as a detached java process.

Layout under $SAGA_HOME/kafka/: lib/ (jars), m2/ (Maven's local repository), build/pom.xml, server.properties,
log4j2.properties, data/ (KRaft log dir), logs/ (server.log, server.out), kafka.pid, secrets/ (the SASL_SSL
listener's CA, keystore and SCRAM password: ``infra.launcher.security``).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import shutil
import signal
import subprocess
import uuid
from pathlib import Path

from ..kafka_admin import wait_for_broker
from ..kafka_clients import KafkaClients
from ..settings import KAFKA_NODE_PORT_STEP, Settings
from .process import (
    LauncherError,
    Report,
    bind_failure,
    is_alive,
    port_trouble,
    read_pid,
    refuse_unusable_port,
    stop_process,
    tail,
)
from .security import SCRAM_MECHANISMS, SCRAM_USER, LocalSecrets, add_scram_user

INFRA_DIR = Path(__file__).resolve().parent.parent
POM = INFRA_DIR / "pom.xml"
LOG4J2 = INFRA_DIR / "log4j2.properties"
KAFKA_VERSION = "4.1.1"  # the version pinned in infra/pom.xml, for messages only

# Kafka's own launch script uses the same collector flags; the heap stays small because this is a test box.
JVM_FLAGS = [
    "-Xms128m",
    "-Xmx512m",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
    # Kafka logs its own shutdown; log4j2's hook would close the log first and swallow those lines.
    "-Dlog4j2.shutdownHookEnabled=false",
]


def _cluster_id() -> str:
    """A random KRaft cluster id: 16 random bytes, URL-safe base64 without padding (Kafka's Uuid format)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):  # Kafka avoids ids starting with '-', which read as a CLI option
            return text


def _tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None and name == "java" and os.environ.get("JAVA_HOME"):
        candidate = Path(os.environ["JAVA_HOME"]) / "bin" / "java"
        path = str(candidate) if candidate.exists() else None
    if path is None:
        raise LauncherError(f"`{name}` not found; the local Kafka needs it: apt-get install -y {package}")
    return path


def kafka_nodes(settings: Settings) -> list[KafkaLauncher]:
    """The local brokers SAGA_KAFKA_BROKERS asks for: one (the default), or the nodes of a cluster."""
    return [KafkaLauncher(settings, node) for node in range(1, settings.saga_kafka_brokers + 1)]


def every_kafka_node(settings: Settings) -> list[KafkaLauncher]:
    """The single broker and the nodes of the cluster last started in this SAGA_HOME, whatever
    SAGA_KAFKA_BROKERS says now (``saga infra down`` stops them all)."""
    single = settings.model_copy(update={"saga_kafka_brokers": 1})
    recorded = KafkaLauncher(single).home / "cluster" / "brokers"
    count = int(recorded.read_text()) if recorded.exists() else 1
    cluster = settings.model_copy(update={"saga_kafka_brokers": count})
    return kafka_nodes(single) + (kafka_nodes(cluster) if count > 1 else [])


class KafkaLauncher:
    """Prepare, start, stop and inspect one local broker of a SAGA_HOME: the single broker (the default), or
    node ``node`` of a local cluster of SAGA_KAFKA_BROKERS brokers (each broker and controller, a static
    quorum of all of them, every internal topic replicated to three) under ``$SAGA_HOME/kafka/cluster``."""

    def __init__(self, settings: Settings, node: int = 1) -> None:
        self.node = node
        self.nodes = settings.saga_kafka_brokers
        shift = KAFKA_NODE_PORT_STEP * (node - 1)
        self.port = settings.saga_kafka_port + shift
        self.controller_port = settings.saga_kafka_controller_port + shift
        self.secure_port = settings.saga_kafka_secure_port + shift
        self._controller_ports = [settings.saga_kafka_controller_port + KAFKA_NODE_PORT_STEP * (n - 1)
                                  for n in range(1, self.nodes + 1)]
        kafka_home = settings.saga_home.expanduser().resolve() / "kafka"
        self.home = kafka_home if self.nodes == 1 else kafka_home / "cluster" / f"node-{node}"
        self.lib_dir = kafka_home / "lib"
        self.data_dir = self.home / "data"
        self.logs_dir = self.home / "logs"
        self.config_path = self.home / "server.properties"
        self.pid_file = self.home / "kafka.pid"
        self.secrets = LocalSecrets(kafka_home / "secrets")
        self._cluster_id_file = kafka_home / "cluster" / "cluster.id"

    @property
    def bootstrap(self) -> str:
        """The bootstrap servers of the local broker."""
        return f"127.0.0.1:{self.port}"

    @property
    def secure_bootstrap(self) -> str:
        """The bootstrap servers of the local broker's SASL_SSL listener (SCRAM, ``self.secrets``)."""
        return f"127.0.0.1:{self.secure_port}"

    def pid(self) -> int | None:
        """The broker's pid when it runs (checked against its command line), else None."""
        pid = read_pid(self.pid_file)
        # The config path is unique per SAGA_HOME, so a reused pid or another home's broker never matches.
        return pid if pid is not None and is_alive(pid, str(self.config_path)) else None

    def prepare(self, report: Report) -> None:
        """Fetch the jars (first run), write the configuration and format the KRaft storage (first run)."""
        if self.node == 1 and not self._jars_current():
            report(f"resolving Kafka {KAFKA_VERSION} jars with Maven (first run only)")
            self._fetch_jars()
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self.secrets.ensure()
        shutil.copyfile(LOG4J2, self.home / "log4j2.properties")
        self.config_path.write_text(self._server_properties())
        self.config_path.chmod(0o600)  # it holds the keystore password
        if not (self.data_dir / "meta.properties").exists():
            report("formatting the KRaft log folder")
            self._format()

    def ports(self) -> dict[int, str]:
        """This node's ports, each with the setting it comes from."""
        node = "" if self.nodes == 1 else f" (node {self.node}: + {KAFKA_NODE_PORT_STEP * (self.node - 1)})"
        return {self.port: f"SAGA_KAFKA_PORT{node}", self.controller_port: f"SAGA_KAFKA_CONTROLLER_PORT{node}",
                self.secure_port: f"SAGA_KAFKA_SECURE_PORT{node}"}

    def refuse_unusable_ports(self) -> None:
        """LauncherError, in one line naming the setting, when a port of this node cannot be counted on."""
        for port, setting in self.ports().items():
            refuse_unusable_port(port, setting)

    def start(self, report: Report) -> int:
        """Start the broker detached from this process (own session, parent init); returns its pid."""
        report("starting the broker")
        java = _tool("java", "openjdk-17-jre-headless")
        command = [java, *self._jvm_args(), "kafka.Kafka", str(self.config_path)]
        # sh forks the broker in the background and exits, so the broker is nobody's child here: no zombie
        # and no "subprocess still running" warning in a long-lived caller such as the test session.
        launched = subprocess.run(
            ["/bin/sh", "-c", '"$@" >>"$SAGA_KAFKA_OUT" 2>&1 </dev/null & echo $!', "sh", *command],
            env={**os.environ, "SAGA_KAFKA_OUT": str(self.logs_dir / "server.out")},
            cwd=self.home,
            capture_output=True,
            text=True,
            check=True,
            start_new_session=True,
        )
        pid = int(launched.stdout.strip())
        self.pid_file.write_text(f"{pid}\n")
        return pid

    async def wait_ready(self, pid: int, seconds: float = 120.0) -> None:
        """Wait until the broker answers a metadata request; fail early, with its log, if it dies."""

        def alive() -> bool:
            return is_alive(pid)

        if not await wait_for_broker(KafkaClients(self.bootstrap), seconds, alive):
            state = "exited" if not alive() else f"did not answer within {seconds:.0f} s"
            log = self.logs_dir / "server.log"
            failed = bind_failure(tail(log, 400)) or bind_failure(tail(self.logs_dir / "server.out", 400))
            ports = self.ports()
            if failed is not None and failed.port in ports:
                trouble = port_trouble(failed.port, ports[failed.port], failed.words, log)
                raise LauncherError(f"Kafka {state}: {trouble}")
            raise LauncherError(f"Kafka {state}. Last lines of {log}:\n{tail(log)}\n"
                                f"{tail(self.logs_dir / 'server.out', 5)}")
        # A log folder formatted before the SASL_SSL listener existed gets its user now (once).
        java = _tool("java", "openjdk-17-jre-headless")
        await asyncio.to_thread(add_scram_user, java, self._jvm_args(), self.bootstrap, self.secrets,
                                self._scram_marker)

    def stop(self, report: Report, timeout: float = 60.0) -> bool:
        """Stop the broker (SIGTERM: controlled shutdown; SIGKILL after `timeout`); False if it was down."""
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        report(f"stopping the broker (pid {pid})")
        stop_process(pid, signal.SIGTERM, timeout, report=report)
        self.pid_file.unlink(missing_ok=True)
        return True

    # -- internals -------------------------------------------------------------------------------------------

    def _jvm_args(self) -> list[str]:
        return [
            *JVM_FLAGS,
            f"-Dlog4j2.configurationFile={self.home / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self.logs_dir}",
            "-cp",
            f"{self.lib_dir}/*",
        ]

    @property
    def _scram_marker(self) -> Path:
        return self.data_dir / ".scram-user"

    def _cluster_id(self) -> str:
        """A fresh id for a single broker; one id shared by the nodes of a cluster (made by the first)."""
        if self.nodes == 1:
            return _cluster_id()
        self._cluster_id_file.parent.mkdir(parents=True, exist_ok=True)
        (self._cluster_id_file.parent / "brokers").write_text(f"{self.nodes}\n")  # for every_kafka_node
        if not self._cluster_id_file.exists():
            self._cluster_id_file.write_text(_cluster_id())
        return self._cluster_id_file.read_text().strip()

    def _pom_digest(self) -> str:
        return hashlib.sha256(POM.read_bytes()).hexdigest()

    def _jars_current(self) -> bool:
        stamp = self.lib_dir / ".pom.sha256"
        return stamp.exists() and stamp.read_text().strip() == self._pom_digest()

    def _fetch_jars(self) -> None:
        mvn = _tool("mvn", "maven")
        _tool("java", "openjdk-17-jre-headless")
        build_dir = self.home / "build"
        build_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(POM, build_dir / "pom.xml")
        staging = self.home / "lib.partial"
        shutil.rmtree(staging, ignore_errors=True)
        result = subprocess.run(
            [
                mvn,
                "-B",
                "-q",
                "-Dstyle.color=never",
                "-f",
                str(build_dir / "pom.xml"),
                f"-Dmaven.repo.local={self.home / 'm2'}",
                "dependency:copy-dependencies",
                "-DincludeScope=runtime",
                f"-DoutputDirectory={staging}",
            ],
            cwd=build_dir,
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            output = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
            raise LauncherError(f"Maven could not fetch the Kafka jars (Maven Central reachable?):\n{output}")
        (staging / ".pom.sha256").write_text(self._pom_digest())
        # Swap in the complete folder only, so an interrupted download never leaves a half classpath behind.
        shutil.rmtree(self.lib_dir, ignore_errors=True)
        staging.rename(self.lib_dir)

    def _format(self) -> None:
        result = subprocess.run(
            [
                _tool("java", "openjdk-17-jre-headless"),
                *self._jvm_args(),
                "kafka.tools.StorageTool",
                "format",
                "--cluster-id",
                self._cluster_id(),
                "--config",
                str(self.config_path),
                "--ignore-formatted",
                # The SASL_SSL listener's user goes into the first metadata records: no tool run after start.
                *(argument for mechanism in SCRAM_MECHANISMS for argument in (
                    "--add-scram", f"{mechanism}=[name={SCRAM_USER},password={self.secrets.scram_password}]")),
            ],
            cwd=self.home,
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise LauncherError(f"formatting the Kafka storage failed:\n{result.stdout}{result.stderr}")
        self._scram_marker.write_text(f"{SCRAM_USER}\n")

    def _server_properties(self) -> str:
        """Combined broker+controller on 127.0.0.1 with a static quorum: one voter and every factor 1 for a
        single broker; every node a voter, internal topics on three replicas (two in sync) in a cluster.

        A static quorum (controller.quorum.voters) keeps the formatted storage independent of the ports,
        so changing SAGA_KAFKA_PORT / SAGA_KAFKA_CONTROLLER_PORT later needs no re-format.
        """
        replicas = str(min(3, self.nodes))
        in_sync = str(min(2, self.nodes))
        settings = {
            "process.roles": "broker,controller",
            "node.id": str(self.node),
            "controller.quorum.voters": ",".join(f"{n}@127.0.0.1:{port}"
                                                 for n, port in enumerate(self._controller_ports, start=1)),
            "listeners": (f"PLAINTEXT://127.0.0.1:{self.port},SASL_SSL://127.0.0.1:{self.secure_port},"
                          f"CONTROLLER://127.0.0.1:{self.controller_port}"),
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port},SASL_SSL://127.0.0.1:{self.secure_port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL",
            # The SASL_SSL listener: TLS with the launcher's own CA, SCRAM users (infra.launcher.security).
            "sasl.enabled.mechanisms": ",".join(SCRAM_MECHANISMS),
            **{f"listener.name.sasl_ssl.{mechanism.lower()}.sasl.jaas.config":
               "org.apache.kafka.common.security.scram.ScramLoginModule required;" for mechanism in SCRAM_MECHANISMS},
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": str(self.secrets.keystore),
            "ssl.keystore.password": self.secrets.keystore_password,
            "ssl.key.password": self.secrets.keystore_password,
            "log.dirs": str(self.data_dir),
            "num.partitions": "1",
            "default.replication.factor": replicas,
            "min.insync.replicas": in_sync,
            # Every process creates its topics with SAGA_TOPIC_PARTITIONS and refuses topics of another count; a
            # topic a producer or consumer made by merely naming it would get num.partitions and stop them all.
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": replicas,
            # Fewer internal partitions than the default 50: the first consumer group and the first
            # transactional producer on a fresh broker wait for these topics to be created.
            "offsets.topic.num.partitions": "10",
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": in_sync,
            "transaction.state.log.num.partitions": "10",
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": in_sync,
            "group.initial.rebalance.delay.ms": "0",
            # The compaction buffer is 128 MB by default and allocated up front; 2 MB is plenty here.
            "log.cleaner.dedupe.buffer.size": str(2 * 1024 * 1024),
            "num.network.threads": "2",
            "num.io.threads": "4",
            "log.retention.hours": "24",
        }
        return "".join(f"{key}={value}\n" for key, value in settings.items())
