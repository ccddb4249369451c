"""The extension points: one list (console.extension_points), and every registration in a room's
plugins.py, found by discovery, so a new module plugs in without an edit anywhere else."""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

import pytest
from django.utils.module_loading import import_string

import fleet
from console.extension_points import EXTENSION_POINTS, discover_plugins
from incidents import detectors as incident_detectors
from incidents.models import Finding

ROOT = Path(__file__).resolve().parents[1]
APPS = ("console", "incidents", "fleet", "compliance")
# Functions named register_* that register nothing: a noun ("the recovery register's rows").
NOT_REGISTRIES = {"compliance.services.recovery_pack.register_rows"}


@functools.cache
def _modules() -> list[tuple[Path, ast.Module]]:
    return [
        (path, ast.parse(path.read_text(), filename=str(path)))
        for app in APPS
        for path in sorted((ROOT / app).rglob("*.py"))
        if "migrations" not in path.parts
    ]


def _dotted(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def _registry_names() -> set[str]:
    return {point.registry.rsplit(".", 1)[1] for point in EXTENSION_POINTS}


def _calls(tree: ast.Module) -> list[tuple[int, str]]:
    """Every call by name in ``tree``: ``f(...)`` and ``x.f(...)`` both give ``f``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if name is not None:
                found.append((node.lineno, name))
    return found


def test_every_extension_point_resolves_to_a_register_function() -> None:
    assert [p.registry for p in EXTENSION_POINTS if not callable(import_string(p.registry))] == []
    assert len(_registry_names()) == len(EXTENSION_POINTS)  # one name, one point: a grep finds it


def test_every_register_function_in_the_code_is_in_the_list() -> None:
    listed = {point.registry for point in EXTENSION_POINTS}
    defined = {
        f"{_dotted(path)}.{node.name}"
        for path, tree in _modules()
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and (node.name == "register" or node.name.startswith("register_"))
    }
    assert defined - NOT_REGISTRIES - listed == set()


def test_registrations_happen_in_plugins_modules_only() -> None:
    names = _registry_names()
    outside = [
        f"{path.relative_to(ROOT)}:{line} calls {name}"
        for path, tree in _modules()
        if path.name != "plugins.py"
        for line, name in _calls(tree)
        if name in names
    ]
    assert outside == []


def test_every_extension_point_has_a_plugin() -> None:
    called = {name for path, tree in _modules() if path.name == "plugins.py" for _, name in _calls(tree)}
    assert _registry_names() - called == set()


def test_the_capacity_pages_queue_panel_is_found_through_the_list() -> None:
    point = next(p for p in EXTENSION_POINTS if p.registry.endswith(".register_pool_section"))
    assert "scheduler" in point.plugs_in
    assert "register_pool_section(" in (ROOT / "fleet" / "scheduler" / "plugins.py").read_text()


@pytest.mark.parametrize("app", ["fleet", "incidents"])
def test_apps_py_imports_nothing_for_its_side_effects(app: str) -> None:
    tree = ast.parse((ROOT / app / "apps.py").read_text())
    imported = [
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    ]
    assert imported == ["django.apps"]


def test_the_detectors_that_read_other_findings_run_after_them() -> None:
    """Storage reads training's firing data-stall findings as its cycle starts, and correlation's
    causes on training's findings read fabric's and storage's: rooms load by name, so fabric and
    storage register (and run) before training."""
    order = list(incident_detectors.registered())
    assert order.index("storage-starvation") < order.index("training-data-stall")
    assert order.index("fabric-link-flap") < order.index("training-hang")


@pytest.mark.django_db
def test_a_new_detector_module_works_from_its_rooms_plugins_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    room = tmp_path / "probe"
    room.mkdir()
    (room / "__init__.py").write_text("")
    (room / "detectors.py").write_text(
        "from incidents.choices import Severity\nfrom incidents.detectors import FindingSpec, detector\n\n\n"
        '@detector("probe-always")\n'
        "def always(now):\n"
        '    return [FindingSpec("probe:1", {"site": "probe"}, Severity.SEV4, "the probe fires")]\n'
    )
    (room / "plugins.py").write_text(
        "from fleet.probe import detectors\nfrom incidents.detectors import register_detectors\n\n"
        "register_detectors(detectors)\n"
    )
    monkeypatch.setattr(fleet, "__path__", [*fleet.__path__, str(tmp_path)])
    monkeypatch.setattr(incident_detectors, "_detectors", dict(incident_detectors._detectors))
    monkeypatch.setattr(incident_detectors, "_judged", dict(incident_detectors._judged))
    try:
        discover_plugins()  # what ConsoleConfig.ready runs; apps.py is not touched
        assert incident_detectors.registered()["probe-always"].__module__ == "fleet.probe.detectors"
        assert incident_detectors.run_detectors(only=["probe-always"]) == {"probe-always": {"firing": 1}}
        assert Finding.objects.get(fingerprint="probe:1").source == "detector:probe-always"
    finally:
        for name in ("fleet.probe.plugins", "fleet.probe.detectors", "fleet.probe"):
            sys.modules.pop(name, None)
