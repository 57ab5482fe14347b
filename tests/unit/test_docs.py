"""The README and the documentation site say what the code does: the README's saga and its tests are the example
files as they run in the suite, the site builds with no broken link or reference, and every setting is listed
with its default."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from saga_orchestrator.infra.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def _python_blocks(markdown: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown, flags=re.DOTALL)


def test_the_readmes_saga_and_its_tests_are_the_example_files_as_printed() -> None:
    blocks = _python_blocks((ROOT / "README.md").read_text())
    for example in ("examples/shop/checkout.py", "examples/shop/test_checkout.py"):
        assert (ROOT / example).read_text() in blocks, f"the README does not print {example} as it is"


def test_the_readme_stays_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 320, len(lines)
    assert "make demo" in "\n".join(lines[:15]) and "make test" in "\n".join(lines[:15])


def test_every_setting_is_listed_with_its_default() -> None:
    listed = (ROOT / "docs" / "settings.md").read_text()
    missing = [name.upper() for name in Settings.model_fields if f"`{name.upper()}`" not in listed]
    assert not missing, f"docs/settings.md lacks {missing}"


def test_the_site_builds_with_no_broken_link_or_reference(tmp_path: Path) -> None:
    built = subprocess.run(["make", "-s", "docs"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    reference = (ROOT / "build" / "site" / "reference" / "index.html").read_text()
    for field in ("max_attempts", "initial_backoff_ms", "compensation_timeout_ms", "deadline_ms", "hold_reply"):
        assert field in reference, field
