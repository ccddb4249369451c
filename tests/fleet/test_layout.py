"""The fleet app's rooms and the one rule between them: imports run down, never sideways or up.

inventory <- telemetry <- {training | serving | capacity <- {power | scheduler} | fabric | storage}
<- cost <- {correlation, ingest}
(cost: prices on the training, serving, capacity, power and scheduler figures; correlation: cause and effect
between sibling rooms). A room imports its own
modules, the rooms below it, and the shared modules at the top of ``fleet`` (``choices``,
``validation``); ``fleet.models`` is for the app's registration and for code outside the app. The
walk reads every import in every module, those inside functions included, so a lazy import
cannot hide an arrow.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

FLEET = Path(__file__).resolve().parents[2] / "fleet"

BELOW: dict[str, set[str]] = {
    "inventory": set(),
    "telemetry": {"inventory"},
    "training": {"inventory", "telemetry"},
    "serving": {"inventory", "telemetry"},
    "capacity": {"inventory", "telemetry"},
    "power": {"inventory", "telemetry", "capacity"},
    "fabric": {"inventory", "telemetry"},
    "storage": {"inventory", "telemetry"},
    "scheduler": {"inventory", "telemetry", "capacity"},
    "cost": {"inventory", "telemetry", "capacity", "power", "training", "serving", "scheduler"},
    "correlation": {"inventory", "telemetry", "training", "fabric", "storage", "cost"},
    "ingest": {
        "inventory",
        "telemetry",
        "training",
        "serving",
        "capacity",
        "power",
        "fabric",
        "storage",
        "scheduler",
        "cost",
    },
}
SHARED = {"fleet.choices", "fleet.validation", "fleet.exporters"}
DOMAIN_WORDS = ("training", "serving", "capacity", "power", "fabric", "storage", "scheduler", "cost")


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports from the project, with its line: ``from x import y`` gives
    ``x.y`` when ``y`` is a module of ``x``'s package (``from fleet.training import goodput``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                is_module = (FLEET.parent / (sub.replace(".", "/") + ".py")).exists() or (
                    FLEET.parent / sub.replace(".", "/")
                ).is_dir()
                found.append((node.lineno, sub if is_module else node.module))
    return [(line, name) for line, name in found if name == "fleet" or name.startswith("fleet.")]


def _room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in BELOW else None


def _violations(room: str) -> list[str]:
    bad = []
    for path in sorted((FLEET / room).rglob("*.py")):
        for line, module in _imports(path):
            target = _room(module)
            allowed = (
                target == room
                or target in BELOW[room]
                or any(module == s or module.startswith(s + ".") for s in SHARED)
            )
            if not allowed:
                bad.append(f"{path.relative_to(FLEET.parent)}:{line} imports {module}")
    return bad


@pytest.mark.parametrize("room", sorted(BELOW))
def test_a_room_imports_only_itself_the_rooms_below_and_the_shared_modules(room: str) -> None:
    assert _violations(room) == []


def test_the_walk_catches_a_sideways_and_an_upward_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = tmp_path / "fleet"
    for room in ("serving", "training", "inventory"):
        (fleet / room).mkdir(parents=True)
        (fleet / room / "__init__.py").write_text("")
    (fleet / "training" / "goodput.py").write_text("")
    (fleet / "serving" / "api.py").write_text("def f():\n    from fleet.training import goodput\n")
    (fleet / "inventory" / "models.py").write_text("import fleet.serving.api\nfrom fleet.models import Job\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["FLEET"]), "FLEET", fleet)
    assert _violations("serving") == ["fleet/serving/api.py:2 imports fleet.training.goodput"]
    assert _violations("inventory") == [
        "fleet/inventory/models.py:1 imports fleet.serving.api",
        "fleet/inventory/models.py:2 imports fleet.models",
    ]


def test_no_domain_module_is_left_at_the_top_of_the_app() -> None:
    loose = [
        str(p.relative_to(FLEET.parent))
        for folder in (FLEET, FLEET / "services", FLEET / "api")
        if folder.is_dir()
        for p in folder.glob("*.py")
        if any(word in p.name for word in DOMAIN_WORDS)
    ]
    assert loose == []
    assert not (FLEET / "services").exists() and not (FLEET / "api").exists()


def test_each_room_is_a_package() -> None:
    assert all((FLEET / room / "__init__.py").exists() for room in BELOW)
