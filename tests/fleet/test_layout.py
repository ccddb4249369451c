"""The fleet app's rooms, the one rule between them (imports run down, never sideways or up) and the
one skeleton inside them (the same file name for the same job in every room, SKELETON below).

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


# The room skeleton (issue 38): one file name per job in every room. Any of them may be a package
# of the same name when large (``read/``, ``actions/``); a module with a domain name of its own
# (goodput.py, slo.py, prices.py) is fine.
SKELETON = {
    "models.py": "tables",
    "store.py": "what the ingest doors write",
    "actions.py": "commands a person or the API triggers",
    "read.py": "what pages and APIs read",
    "detectors.py": "detectors",
    "api.py": "the REST API (with api_urls.py, serializers.py, filtersets.py)",
    "views.py": "HTML pages (with urls.py, forms.py)",
    "live.py": "websocket pushes",
    "tasks.py": "Celery tasks",
    "simulator.py": "demo data",
    "plugins.py": "what the room plugs into the project's extension points",
    "mappings.py": "the room's exporter-series mapping entries",
}
# Names that grew for one of those jobs, and the skeleton's file(s) for it.
SYNONYMS = {
    "services": ("actions.py", "read.py"),
    "dashboard": ("read.py",),
    "dashboard_api": ("api.py",),
    "endpoint_api": ("api.py",),
    "panels": ("read.py", "plugins.py"),
    "readmodel": ("read.py",),
    "pages": ("read.py", "views.py"),
    "fleet_page": ("read.py",),
    "gpu_table": ("read.py",),
    "queries": ("read.py",),
    "selectors": ("read.py",),
}


def _misnamed() -> list[str]:
    """Every module or package inside a room named with a synonym, with the job and its file."""
    found = []
    for room in sorted(p for p in FLEET.iterdir() if (p / "__init__.py").exists()):
        for entry in sorted(room.rglob("*")):
            if entry.suffix == ".py":
                name = entry.stem
            elif entry.is_dir() and (entry / "__init__.py").exists():
                name = entry.name
            else:
                continue
            if name in SYNONYMS:
                jobs = ", ".join(f"{file} for {SKELETON[file]}" for file in SYNONYMS[name])
                found.append(f"{entry.relative_to(FLEET.parent)}: use {jobs}")
    return found


def test_every_room_names_each_job_as_the_skeleton_does() -> None:
    assert _misnamed() == []


def test_the_skeleton_check_names_the_job_and_its_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = tmp_path / "fleet"
    for package in ("power", "telemetry", "telemetry/read", "scheduler", "scheduler/panels", "training"):
        (fleet / package).mkdir(parents=True)
        (fleet / package / "__init__.py").write_text("")
    for module in ("power/services.py", "telemetry/read/gpu_table.py", "training/read.py", "training/goodput.py"):
        (fleet / module).write_text("")
    monkeypatch.setattr(__import__(__name__, fromlist=["FLEET"]), "FLEET", fleet)
    assert _misnamed() == [
        "fleet/power/services.py: use actions.py for commands a person or the API triggers, "
        "read.py for what pages and APIs read",
        "fleet/scheduler/panels: use read.py for what pages and APIs read, "
        "plugins.py for what the room plugs into the project's extension points",
        "fleet/telemetry/read/gpu_table.py: use read.py for what pages and APIs read",
    ]
