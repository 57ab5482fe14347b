"""The built wheel in a fresh virtual environment, used from an application folder that holds its own ``cli/``,
``client.py`` and ``schemas.py`` (names an application is likely to have): ``saga run all`` starts every service,
and a trip started from that folder with the installed client completes.

Every service and the application import their own modules here; should one of them pick up the folder's files
instead of the installed package, that file raises and the saga never completes. The virtual environment gets
the dependencies from the test environment's site-packages (a path entry, whose own ``.pth`` files, and so the
repository's editable install, are not read), so only the package itself comes from the wheel.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from saga_orchestrator.infra.kafka_admin import ensure_topics
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.participants.trip import PARTICIPANTS
from saga_orchestrator.schemas.topics import Topics

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
NOT_SOURCES = (".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis")
SHADOWING = "raise RuntimeError('the application folder\\'s own {name} was imported instead of the package')\n"
APPLICATION = textwrap.dedent("""
    import asyncio
    import sys

    import saga_orchestrator
    from saga_orchestrator.client import SagaClient

    TRIP = {"customer_id": "c-wheel", "origin": "LIS", "destination": "NYC", "depart_date": "2027-03-01",
            "return_date": "2027-03-09", "currency": "EUR", "card_token": "tok_ok",
            "email": "wheel@example.test", "amount_cents": 84900}


    async def main() -> None:
        async with SagaClient.from_settings() as client:
            handle = await client.start("trip", sys.argv[1], TRIP)
            ended = await handle.result(timeout_s=120)
        print(type(ended).__name__, list(saga_orchestrator.__path__)[0])


    asyncio.run(main())
""")


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment with the wheel built from this checkout installed (dependencies borrowed)."""
    work = tmp_path_factory.mktemp("wheel")
    # Built from a copy: setuptools packs whatever its build/ folder holds, files deleted since included.
    source = work / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*NOT_SOURCES))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(work / "dist"), str(source)],
                   check=True, timeout=300)
    wheels = list((work / "dist").glob("saga_orchestrator-*.whl"))
    assert len(wheels) == 1, wheels
    environment = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(environment)], check=True, timeout=120)
    purelib = subprocess.run([str(environment / "bin" / "python"), "-c",
                              "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    (Path(purelib) / "borrowed_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(environment / "bin" / "pip"), "install", "-q", "--no-deps", str(wheels[0])],
                   check=True, timeout=300)
    return environment


@pytest.fixture(scope="module")
def application(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An application folder whose own modules carry the names the package must not be confused with."""
    folder = tmp_path_factory.mktemp("application")
    (folder / "cli").mkdir()
    (folder / "cli" / "__init__.py").write_text(SHADOWING.format(name="cli/"))
    (folder / "client.py").write_text(SHADOWING.format(name="client.py"))
    (folder / "schemas.py").write_text(SHADOWING.format(name="schemas.py"))
    (folder / "app.py").write_text(APPLICATION)
    return folder


@pytest.fixture(scope="module")
def environment(settings: Settings) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("SAGA_", "PYTHON"))}
    env.update({"KAFKA_BOOTSTRAP_SERVERS": settings.kafka_servers(), "DATABASE_URL": settings.dsn(),
                "SAGA_TOPIC_PREFIX": settings.saga_topic_prefix, "SAGA_HOME": str(settings.saga_home),
                "SAGA_APP": "saga_orchestrator.participants.trip:app",
                "SAGA_PARTICIPANTS": "flight+hotel+payment+notification"})
    return env


@pytest.fixture(scope="module")
def services(venv: Path, application: Path, environment: dict[str, str], settings: Settings) -> Iterator[Path]:
    """``saga run all`` of the installed package, started in the application folder; its log folder."""
    topics = Topics(settings.saga_topic_prefix)
    asyncio.run(ensure_topics(settings.kafka(), topics.all(PARTICIPANTS), settings.topic_layout()))
    logs = application / "logs"
    logs.mkdir()
    with (logs / "run-all.log").open("wb") as output:
        process = subprocess.Popen([str(venv / "bin" / "saga"), "run", "all", "--log-dir", str(logs)],
                                   cwd=application, env=environment, stdout=output, stderr=output)
    try:
        yield logs
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_the_installed_client_imports_nothing_of_the_application_folder(venv: Path, application: Path,
                                                                       environment: dict[str, str]) -> None:
    result = subprocess.run([str(venv / "bin" / "python"), "-c",
                             "from saga_orchestrator.client import SagaClient; import saga_orchestrator.schemas.codec"],
                            cwd=application, env=environment, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_a_trip_started_from_the_application_folder_completes(venv: Path, application: Path,
                                                              environment: dict[str, str], services: Path) -> None:
    result = subprocess.run([str(venv / "bin" / "python"), "app.py", "wheel-trip-1"], cwd=application,
                            env=environment, capture_output=True, text=True, timeout=180)
    logs = "\n".join(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}"
                     for path in sorted(services.glob("*.log")))
    assert result.returncode == 0, f"{result.stderr}\n{logs}"
    status, installed_at = result.stdout.split()
    assert status == "SagaCompleted"
    assert Path(installed_at).is_relative_to(venv), installed_at
    assert "was imported instead of the package" not in logs
