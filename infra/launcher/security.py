"""The local brokers' SASL_SSL listener: a CA and a broker certificate made for loopback, and a SCRAM user.

Every local broker listens on PLAINTEXT (what the services use by default) and on SASL_SSL with SCRAM, so
the suite can run the system over TLS and SASL as a production cluster asks for (``tests/e2e/test_secured.py``)
without Docker. The material lives in ``$SAGA_HOME/kafka/secrets``, made once by ``ensure``:

    ca.pem            the CA clients trust (SAGA_KAFKA_SSL_CAFILE)
    broker.p12        the brokers' key and certificate (for 127.0.0.1 and localhost), signed by the CA
    keystore.password the PKCS#12 store's password
    scram.password    the password of SCRAM user ``SCRAM_USER`` (SCRAM-SHA-256 and SCRAM-SHA-512)

The user is added to a running broker by ``add_scram_user`` (Kafka's ConfigCommand over the PLAINTEXT
listener), once per KRaft log folder.
"""

from __future__ import annotations

import datetime
import ipaddress
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .process import LauncherError

SCRAM_USER = "saga"
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
VALID_DAYS = 3650


@dataclass(frozen=True)
class LocalSecrets:
    """Where the local SASL_SSL listener's material is, once made."""

    folder: Path

    @property
    def ca_file(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def keystore(self) -> Path:
        return self.folder / "broker.p12"

    @property
    def keystore_password(self) -> str:
        return (self.folder / "keystore.password").read_text().strip()

    @property
    def scram_password(self) -> str:
        return (self.folder / "scram.password").read_text().strip()

    def ensure(self) -> LocalSecrets:
        """Make the CA, the broker's keystore and the passwords unless they exist (idempotent)."""
        if all(path.exists() for path in (self.ca_file, self.keystore, self.folder / "keystore.password",
                                            self.folder / "scram.password")):
            return self
        self.folder.mkdir(parents=True, exist_ok=True)
        self.folder.chmod(0o700)
        ca_key, ca_cert = _ca()
        broker_key = ec.generate_private_key(ec.SECP256R1())
        broker_cert = _broker_certificate(broker_key, ca_key, ca_cert)
        store_password = secrets.token_urlsafe(18)
        keystore = pkcs12.serialize_key_and_certificates(
            b"broker", broker_key, broker_cert, [ca_cert],
            serialization.BestAvailableEncryption(store_password.encode()))
        _write(self.folder / "keystore.password", store_password.encode())
        _write(self.folder / "scram.password", secrets.token_urlsafe(18).encode())
        _write(self.keystore, keystore)
        _write(self.ca_file, ca_cert.public_bytes(serialization.Encoding.PEM), private=False)
        return self

    def client_environment(self, bootstrap: str) -> dict[str, str]:
        """The settings a service needs to connect through the SASL_SSL listener at ``bootstrap``."""
        return {
            "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "SAGA_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "SAGA_KAFKA_SASL_MECHANISM": SCRAM_MECHANISMS[0],
            "SAGA_KAFKA_SASL_USERNAME": SCRAM_USER,
            "SAGA_KAFKA_SASL_PASSWORD": self.scram_password,
            "SAGA_KAFKA_SSL_CAFILE": str(self.ca_file),
        }


def add_scram_user(java: str, jvm_args: list[str], bootstrap: str, local: LocalSecrets, marker: Path) -> None:
    """Give the broker at ``bootstrap`` (PLAINTEXT) the SCRAM user, once per log folder (``marker``)."""
    if marker.exists():
        return
    password = local.scram_password
    for mechanism in SCRAM_MECHANISMS:  # one mechanism per request: Kafka refuses two for one user at once
        result = subprocess.run(
            [java, *jvm_args, "kafka.admin.ConfigCommand", "--bootstrap-server", bootstrap, "--alter",
             "--add-config", f"{mechanism}=[iterations=8192,password={password}]",
             "--entity-type", "users", "--entity-name", SCRAM_USER],
            capture_output=True, text=True, timeout=120,
        )
        if result.returncode != 0:
            raise LauncherError(f"adding the SCRAM user {SCRAM_USER} ({mechanism}) to the local broker failed:\n"
                                f"{result.stdout[-2000:]}{result.stderr[-2000:]}")
    marker.write_text(f"{SCRAM_USER}\n")


def _ca() -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "saga-orchestrator local CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return key, cert


def _broker_certificate(key: ec.EllipticCurvePrivateKey, ca_key: ec.EllipticCurvePrivateKey,
                        ca_cert: x509.Certificate) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    return (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))


def _write(path: Path, data: bytes, private: bool = True) -> None:
    path.write_bytes(data)
    path.chmod(0o600 if private else 0o644)
