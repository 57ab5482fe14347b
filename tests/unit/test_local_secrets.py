"""The local SASL_SSL listener's material: a CA, a broker certificate it signed for loopback, made once."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.serialization import pkcs12

from saga_orchestrator.infra.launcher.security import SCRAM_USER, LocalSecrets


def test_the_broker_certificate_is_signed_by_the_ca_for_loopback(tmp_path: Path) -> None:
    local = LocalSecrets(tmp_path / "secrets").ensure()
    ca = x509.load_pem_x509_certificate(local.ca_file.read_bytes())
    key, cert, chain = pkcs12.load_key_and_certificates(local.keystore.read_bytes(), local.keystore_password.encode())
    assert key is not None and cert is not None
    cert.verify_directly_issued_by(ca)  # raises unless the CA signed it
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in names.get_values_for_type(x509.IPAddress)
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    assert [c.subject for c in chain] == [ca.subject]
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert local.client_environment("127.0.0.1:1")["SAGA_KAFKA_SASL_USERNAME"] == SCRAM_USER
    assert oct(local.keystore.stat().st_mode & 0o777) == "0o600"


def test_ensure_keeps_what_exists(tmp_path: Path) -> None:
    first = LocalSecrets(tmp_path / "secrets").ensure()
    ca, password = first.ca_file.read_bytes(), first.scram_password
    again = LocalSecrets(tmp_path / "secrets").ensure()
    assert (again.ca_file.read_bytes(), again.scram_password) == (ca, password)
