"""Every import points down the layers (ARCHITECTURE.md, the README's Layout): a lower package never imports
a higher one, at module level, inside a function or under TYPE_CHECKING alike."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
# Lowest first. A package may import its own layer and any below it.
LAYERS = (
    "core",
    "pipelines",
    "features",
    "model_contract",
    "training",
    "serving",
    "monitoring",
    "orchestration",
    "mlops",
    "dags",
)
RANK = {name: rank for rank, name in enumerate(LAYERS)}


def imported_packages(source: str) -> set[tuple[int, str]]:
    """(line, top-level package) of every absolute import in `source`."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {(node.lineno, alias.name.split(".")[0]) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add((node.lineno, node.module.split(".")[0]))
    return found


def upward_imports(root: Path) -> list[str]:
    problems = []
    for package in LAYERS:
        for path in sorted((root / package).rglob("*.py")):
            for line, target in imported_packages(path.read_text()):
                if target in RANK and RANK[target] > RANK[package]:
                    problems.append(f"{path.relative_to(root)}:{line} imports {target} (a higher layer)")
    return problems


def test_no_package_imports_a_higher_layer():
    assert upward_imports(REPO) == []


def test_every_packaged_module_has_a_layer():
    packaged = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"][
        "wheel"
    ]
    assert set(packaged["packages"]) <= set(LAYERS)


@pytest.mark.parametrize(
    ("package", "statement", "upward"),
    [
        ("core", "from pipelines.lake import Tables", True),
        ("pipelines", "def f():\n    from training import steps", True),
        ("training", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from mlops import cli", True),
        ("features", "import orchestration.tasks", True),
        ("training", "from features import offline", False),
        ("dags", "from mlops import chain", False),
    ],
)
def test_the_check_sees_an_upward_import_wherever_it_is(tmp_path, package, statement, upward):
    (tmp_path / package).mkdir()
    (tmp_path / package / "module.py").write_text(statement + "\n")
    assert bool(upward_imports(tmp_path)) is upward


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, absolutely, at any depth of its code."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}  # `from training import x`
    return found


def test_serving_imports_nothing_from_training_and_the_input_contract_stands_alone():
    """The scoring service reads the model's input contract and names from model_contract, never from the
    training code; the training set and the feature rows no longer import each other."""
    serving = {
        f"{path.relative_to(REPO)} imports {module}"
        for path in sorted((REPO / "serving").rglob("*.py"))
        for module in _imports(path)
        if module == "training" or module.startswith("training.")
    }
    assert serving == set()
    contract = {m for path in (REPO / "model_contract").rglob("*.py") for m in _imports(path)}
    assert not {m for m in contract if m.split(".")[0] in {"training", "serving", "monitoring"}}, contract
    assert "training.dataset" not in _imports(REPO / "training" / "feature_rows.py")
