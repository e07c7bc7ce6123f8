"""Dependencies point down: ``common`` < each service package < ``cli``, read from every module's imports.

``common/`` imports nothing from ``services/``, ``cli/``, ``bench/`` or ``tests/``; ``services/X`` imports
nothing from ``services/Y`` (another service is reached through its contract in ``common/``) and nothing
from ``cli/``, ``bench/`` or ``tests/``. Inside the worker, the service and the engine contract at the top of
``services/worker/`` import no engine implementation (``engines/``: the CLI picks and builds the engine).
The tests' harness (``tests/harness/``) is the tests' own: nothing installed with the package (``cli/``,
``common/``, ``services/``, ``bench/lib/``) imports from ``tests/``; benchmark scripts under ``bench/`` may. No
module edits ``sys.path``. Imports inside functions count too.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ABOVE_SERVICES = ("cli", "bench", "tests")

# (importing service, imported service) -> why that edge is allowed. None remain; add one only with a reason.
ALLOWED_SERVICE_EDGES: dict[tuple[str, str], str] = {}


def imported_names(path: Path, root: Path = ROOT) -> list[str]:
    """Dotted names ``path`` imports: ``from a.b import c`` gives ``a.b.c`` (relative ones resolved)."""
    package = path.relative_to(root).with_suffix("").parts[:-1]
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(p for p in (*package[: len(package) - node.level + 1], node.module or "") if p)
            names += [f"{base}.{alias.name}" for alias in node.names]
    return names


def _violations(package: str, rule: Callable[[Path, list[str]], str | None]) -> list[str]:
    out = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for name in imported_names(path):
            reason = rule(path, name.split("."))
            if reason:
                out.append(f"{path.relative_to(ROOT)}: imports {name} ({reason})")
    return out


def test_common_imports_no_layer_above_it() -> None:
    def rule(_path: Path, name: list[str]) -> str | None:
        return "common is the bottom layer" if name[0] in ("services", *ABOVE_SERVICES) else None

    assert _violations("common", rule) == []


def test_a_service_imports_no_other_service_and_no_layer_above() -> None:
    def rule(path: Path, name: list[str]) -> str | None:
        own = path.relative_to(ROOT).parts[1]
        if name[0] in ABOVE_SERVICES:
            return f"services sit below {name[0]}"
        if name[0] == "services" and len(name) > 1 and name[1] != own and (own, name[1]) not in ALLOWED_SERVICE_EDGES:
            return f"services.{own} reaching into services.{name[1]}"
        return None

    assert _violations("services", rule) == []


def test_the_worker_top_imports_no_engine_implementation() -> None:
    def rule(path: Path, name: list[str]) -> str | None:
        top = path.parent == ROOT / "services" / "worker"
        return "engines sit below the worker service" if top and name[:3] == ["services", "worker", "engines"] else None

    assert _violations("services/worker", rule) == []


def test_nothing_installed_imports_the_tests() -> None:
    def rule(_path: Path, name: list[str]) -> str | None:
        return "tests/ is not installed with the package" if name[0] == "tests" else None

    assert [v for package in ("cli", "common", "services", "bench/lib") for v in _violations(package, rule)] == []


def test_no_module_edits_sys_path() -> None:
    edits = [str(path.relative_to(ROOT)) for package in ("cli", "common", "services", "bench", "tests")
             for path in sorted((ROOT / package).rglob("*.py"))
             if path != Path(__file__) and ("sys.path.insert" in path.read_text() or "sys.path.append" in path.read_text())]
    assert edits == []


MAX_MODULE_LINES = 400  # one concept a file: a module past this holds two (docs/development.md)


def test_no_module_of_the_product_is_over_400_lines() -> None:
    long = [f"{path.relative_to(ROOT)}: {n} lines" for package in ("cli", "common", "services")
            for path in sorted((ROOT / package).rglob("*.py"))
            if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES]
    assert long == []


@pytest.mark.parametrize(("source", "expected"), [
    ("from services.worker.engine import Engine\n", ["services.worker.engine.Engine"]),
    ("import services.router.policy as p\n", ["services.router.policy"]),
    ("def f():\n    from cli.options import transport\n", ["cli.options.transport"]),
    ("from .engine import Engine\n", ["services.planner.engine.Engine"]),
    ("from .. import worker\n", ["services.worker"]),
    ("from services import kvtier\n", ["services.kvtier"]),
])
def test_imports_are_read_including_lazy_and_relative_ones(tmp_path: Path, source: str, expected: list[str]) -> None:
    module = tmp_path / "services" / "planner" / "x.py"
    module.parent.mkdir(parents=True)
    module.write_text(source)
    assert imported_names(module, tmp_path) == expected
