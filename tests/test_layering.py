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


BUDGET_RULE = Path("common/continuation.py")  # the one module that says what max_tokens counts at each hop


def budget_arithmetic(source: str) -> list[str]:
    """Expressions that derive a request's budget or prompt from a hand-off: ``max_tokens``/``min_tokens`` on
    the left of + or -, or += / -= on them, ``max_tokens=<constant>``, and + over a ``first_token_id``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            left = node.left.attr if isinstance(node.left, ast.Attribute) else getattr(node.left, "id", None)
            handed = any(isinstance(n, ast.Attribute) and n.attr == "first_token_id" for n in ast.walk(node))
            if left in ("max_tokens", "min_tokens") or handed:
                found.append(ast.unparse(node))
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, (ast.Add, ast.Sub)):
            target = node.target.attr if isinstance(node.target, ast.Attribute) else getattr(node.target, "id", None)
            if target in ("max_tokens", "min_tokens"):
                found.append(ast.unparse(node))
        elif isinstance(node, ast.keyword) and node.arg == "max_tokens" and isinstance(node.value, ast.Constant):
            found.append(ast.unparse(node))
    return found


def test_only_the_continuation_rule_does_budget_arithmetic() -> None:
    """The first-token hand-off and migration are written once: an engine or the frontend that shrinks or
    grows max_tokens, or appends the first token, itself re-derives the rule (common/continuation.py)."""
    found = [f"{path.relative_to(ROOT)}: {expr}" for package in ("cli", "common", "services")
             for path in sorted((ROOT / package).rglob("*.py")) if path.relative_to(ROOT) != BUDGET_RULE
             for expr in budget_arithmetic(path.read_text())]
    assert found == []


@pytest.mark.parametrize(("source", "caught"), [
    ("s = replace(sampling, max_tokens=sampling.max_tokens - 1)\n", True),
    ("max_tokens += 1\n", True),
    ("p = prompt + (handoff.first_token_id,)\n", True),
    ("msg = Generate(sampling=replace(sampling, max_tokens=1))\n", True),
    ("num_total = len(token_ids) + max_tokens\n", False),  # a sequence's length, not a budget
    ("ok = sampling.max_tokens <= 1\n", False),
])
def test_budget_arithmetic_is_caught(source: str, caught: bool) -> None:
    assert bool(budget_arithmetic(source)) is caught


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
