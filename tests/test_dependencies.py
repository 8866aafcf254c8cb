"""Every third-party module the package imports is a declared runtime dependency.

``tools/braid`` installs the package without its dev extras, so an import that only a dev
dependency satisfies works in the test suite and fails on a fresh machine.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {
        _normal(re.split(r"[<>=!~\[; ]", dep, maxsplit=1)[0]) for dep in project["dependencies"]
    }


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _imported() -> dict[str, str]:
    """Top-level third-party module -> the first file importing it."""
    found: dict[str, str] = {}
    for path in sorted((ROOT / "braid_actors").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "braid_actors":
                    found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def test_runtime_imports_are_declared_dependencies() -> None:
    declared = _declared()
    owners = importlib.metadata.packages_distributions()
    missing = {
        module: where
        for module, where in _imported().items()
        if not {_normal(d) for d in owners.get(module, [module])} & declared
    }
    assert not missing, f"imported but not in [project].dependencies: {missing}"


def test_the_check_sees_the_known_dependencies() -> None:
    imported = _imported()
    assert {"trio", "attrs", "orjson", "psutil"} <= set(imported)
