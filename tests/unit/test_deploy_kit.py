"""The deploy kit holds together: the Kubernetes manifests and the compose file pass their schemas, and every
service they run is one ``saga run all`` runs, probed on the port and paths the services serve.

No Docker engine or cluster runs here, so these are the checks the suite can make: the manifests against the
Kubernetes API schemas (kubernetes-validate, offline), the compose file against the compose specification
(check-jsonschema's vendored copy), and the Dockerfile's instructions read as text.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from check_jsonschema.builtin_schemas import get_builtin_schema
from jsonschema import Draft7Validator

from saga_orchestrator.cli.run_cmd import service_commands
from saga_orchestrator.infra.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "infra" / "k8s"
KUBERNETES_VERSION = "1.31.0"


def _documents(path: Path) -> list[dict[str, Any]]:
    return [document for document in yaml.safe_load_all(path.read_text()) if document]


def _manifests() -> list[dict[str, Any]]:
    return [document for path in sorted(K8S.glob("*.yaml")) for document in _documents(path)]


def _run_commands() -> set[tuple[str, ...]]:
    """The ``saga run`` argument lists of every service of ``saga run all`` (the trip's participants)."""
    return {tuple(command[command.index("run"):]) for command in service_commands(Settings()).values()}


@pytest.mark.parametrize("path", sorted(K8S.glob("*.yaml")), ids=lambda path: path.name)
def test_each_manifest_passes_the_kubernetes_schema(path: Path) -> None:
    for document in _documents(path):
        if document["kind"] == "Kustomization":
            continue  # not an API object
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_the_deployments_run_every_service_with_both_probes() -> None:
    manifests = _manifests()
    settings = next(m for m in manifests if m["kind"] == "ConfigMap")["data"]
    deployments = [m for m in manifests if m["kind"] == "Deployment"]
    assert {tuple(d["spec"]["template"]["spec"]["containers"][0]["args"]) for d in deployments} == _run_commands()
    for deployment in deployments:
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        port = next(p for p in container["ports"] if p["name"] == "health")["containerPort"]
        assert str(port) == settings["SAGA_HEALTH_PORT"] and settings["SAGA_HEALTH_HOST"] == "0.0.0.0"
        assert container["livenessProbe"]["httpGet"]["path"] == "/health"
        assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
        sources = {next(iter(source.values()))["name"] for source in container["envFrom"]}
        assert sources == {"saga-settings", "saga-secrets"}
    secret = _documents(K8S / "secret.example.yaml")[0]
    assert {"DATABASE_URL", "SAGA_KAFKA_SASL_PASSWORD"} <= set(secret["stringData"])
    kustomization = _documents(K8S / "kustomization.yaml")[0]
    assert set(kustomization["resources"]) == {"configmap.yaml", "orchestrator.yaml", "participants.yaml"}


def test_every_setting_in_the_config_map_is_one_the_services_read() -> None:
    known = {name.upper() for name in Settings.model_fields}
    settings = next(m for m in _manifests() if m["kind"] == "ConfigMap")["data"]
    assert set(settings) <= known, set(settings) - known


def test_the_compose_file_passes_the_compose_specification() -> None:
    compose = yaml.safe_load((ROOT / "infra" / "docker-compose.yml").read_text())
    validator = Draft7Validator(get_builtin_schema("vendor.compose-spec"))
    errors = sorted(str(error.message) for error in validator.iter_errors(compose))
    assert errors == []
    system = {name: service for name, service in compose["services"].items()
              if "system" in service.get("profiles", [])}
    assert {tuple(service["command"]) for service in system.values()} == _run_commands()
    for service in system.values():
        assert service["environment"]["KAFKA_BOOTSTRAP_SERVERS"] == "kafka:29092"
        assert service["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert "INTERNAL://kafka:29092" in compose["services"]["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]


def test_the_image_holds_every_part_and_runs_saga() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = set(pyproject["tool"]["setuptools"]["package-dir"].values())
    copied = set(re.findall(r"^COPY (\S+) \1$", dockerfile, re.MULTILINE))
    assert folders <= copied, folders - copied
    assert re.search(r'^ENTRYPOINT \["saga"\]$', dockerfile, re.MULTILINE)
    assert json.loads(re.search(r"^CMD (.+)$", dockerfile, re.MULTILINE).group(1)) == [  # type: ignore[union-attr]
        "run", "orchestrator", "--with-relay"]
    assert "SAGA_HEALTH_HOST=0.0.0.0" in dockerfile and "EXPOSE 8080" in dockerfile
    assert '"${PIP' not in dockerfile and 'pip install -c constraints.txt ".[orchestrator]"' in dockerfile
