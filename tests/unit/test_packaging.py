"""The package as pyproject.toml builds it: one top-level name, every package folder of every part listed."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
NAMESPACE = "saga_orchestrator"


def _package_folders(part: str) -> set[str]:
    return {".".join((NAMESPACE, *init.parent.relative_to(ROOT).parts))
            for init in (ROOT / part).rglob("__init__.py") if "__pycache__" not in init.parts}


def test_every_part_is_a_subpackage_of_the_one_installed_name() -> None:
    folders = PYPROJECT["tool"]["setuptools"]["package-dir"]
    assert folders, "no part is mapped"
    for package, folder in folders.items():
        assert package == f"{NAMESPACE}.{folder}", package
        assert (ROOT / folder / "__init__.py").is_file(), folder


def test_every_package_folder_is_listed_so_the_wheel_holds_it() -> None:
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    parts = PYPROJECT["tool"]["setuptools"]["package-dir"].values()
    on_disk = set().union(*(_package_folders(folder) for folder in parts))
    assert on_disk - listed == set(), "add these to [tool.setuptools] packages"
    assert listed - on_disk == set(), "these are listed but are no package folder"


def test_the_console_script_is_in_the_package() -> None:
    assert PYPROJECT["project"]["scripts"]["saga"].startswith(f"{NAMESPACE}.")
