"""The manual (docs/) is held to the code, both ways:

- every setting, route, management command, make target, metric name, file and dotted name (a
  module, function or model) a page mentions exists;
- every setting the code reads from the environment is documented;
- every page renders at /docs/<page>/ for a signed-in user and for nobody else, and every link
  between pages (and from the README into docs/) reaches a page and a heading that exist.

A name is found wherever it is written on a page, prose and code alike, so a shorthand that names
no real setting (`FOLD_BATCHES` for `GOODPUT_INGEST_FOLD_BATCHES`) fails as a wrong name does.
"""

from __future__ import annotations

import ast
import importlib
import itertools
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.conf import settings
from django.core.management import get_commands
from django.test import Client
from django.urls import Resolver404, URLResolver, get_resolver, resolve

from console import docs
from goodput.routing import websocket_urlpatterns

ROOT = Path(__file__).resolve().parents[2]
# The packages whose environment reads must be documented: the apps, the project shell and the
# programs that run on GPU hosts.
CODE_PACKAGES = ("goodput", "console", "fleet", "incidents", "compliance", "clients")
ENV_READERS = {"env", "envbool", "envint", "envfloat", "envlist", "getenv", "get"}
# Names of the environment, by prefix; any other upper-case name is a Django setting or a name
# the code uses (an exporter's field, a label) and must appear in it.
ENV_PREFIXES = ("GOODPUT_", "DATABASE_", "REDIS_", "SECRET_KEY", "ALLOWED_HOSTS", "CSRF_", "DEMO_", "LOG_LEVEL")
UPPER_NAME = re.compile(r"(?<![\w$])[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b")
# File-system paths the pages mention (mounts, spools, backups); every other /path is a route or
# the prefix of routes (`/api/v1/ingest/`), or a network's length (`/32`).
FILE_ROOTS = {"backups", "data", "datasets", "etc", "proc", "srv", "usr", "var"}
PATH_IN_CODE = re.compile(r"(?:^|(?<=[\s(\"']))(/[^\s`'\")]*)")
OWN_URL = re.compile(r"https?://(?:127\.0\.0\.1:8000|goodput\.example\.com)(/[^\s`'\")]*)")
PLACEHOLDERS = {"id": "1", "uuid": "GPU-00000000-0000-0000-0000-000000000000", "hostname": "gpu-a-001"}
COMMAND = re.compile(r"manage\.py\s+([a-z_]+)")
MAKE_TARGET = re.compile(r"`make ([a-z-]+)")
# A metric or series name is an inline code span of its own, its labels dropped:
# `goodput_ingest_ignored_total{door="node_mountstats"}`, `vllm:gpu_cache_usage_perc`.
SERIES = re.compile(
    r"^(?:goodput_[a-z0-9_]+|goodput(?::[a-z]+)+|vllm:[a-z_:]+|(?:nv|tgi|kueue|kube|slurm|velero|node)_[a-z0-9_]+)$"
)
# Series the manual names to say they are not mapped: only forks of the Slurm exporter print them.
NOT_MAPPED = {"slurm_partition_jobs_running", "slurm_gpus_other"}


@cache
def pages() -> dict[str, str]:
    return {name: (docs.DOCS_DIR / f"{name}.md").read_text(encoding="utf-8") for name in docs.page_names()}


@cache
def pages_and_readme() -> dict[str, str]:
    """What the name checks read: the manual, and the README that points into it."""
    return {**pages(), "../README": (ROOT / "README.md").read_text(encoding="utf-8")}


@cache
def source_text() -> str:
    files = itertools.chain.from_iterable((ROOT / package).rglob("*.py") for package in CODE_PACKAGES)
    return "\n".join(path.read_text(encoding="utf-8") for path in files)


def inline_code(text: str) -> list[str]:
    tokens = docs._markdown().parse(text)
    return [child.content for t in tokens for child in t.children or [] if child.type == "code_inline"]


def code_spans(text: str) -> list[str]:
    """Inline code and fenced blocks of a page: where routes and series names are written."""
    tokens = docs._markdown().parse(text)
    spans = [t.content for t in tokens if t.type in ("fence", "code_block")]
    for token in tokens:
        spans += [child.content for child in token.children or [] if child.type == "code_inline"]
    return spans


def _read_argument(node: ast.AST, readers: set[str]) -> ast.expr | None:
    """The name argument of an environment read: env()/envbool()/... (console/env.py), a module's
    own helper that passes its first parameter to one (settings' `_networks(name, ...)`),
    os.environ.get, os.getenv, os.environ[...]."""
    if isinstance(node, ast.Call) and node.args:
        function = node.func
        name = function.id if isinstance(function, ast.Name) else getattr(function, "attr", "")
        if name in readers and (name != "get" or "environ" in ast.unparse(function)):
            return node.args[0]
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
        return node.slice
    return None


def _env_reads(tree: ast.AST) -> set[str]:
    """Names a module reads from the environment: a literal, or each literal of the tuple a `for`
    loop feeds the read (the training client tries several in turn)."""
    readers = set(ENV_READERS)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.args.args:
            first = node.args.args[0].arg
            for inner in ast.walk(node):
                argument = _read_argument(inner, ENV_READERS)
                if isinstance(argument, ast.Name) and argument.id == first:
                    readers.add(node.name)
    loops: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        literal_loop = isinstance(node, ast.For) and isinstance(node.iter, ast.Tuple | ast.List)
        if literal_loop and isinstance(node.target, ast.Name):
            values = [e.value for e in node.iter.elts if isinstance(e, ast.Constant)]
            loops.setdefault(node.target.id, []).extend(v for v in values if isinstance(v, str))
    names: set[str] = set()
    for node in ast.walk(tree):
        argument = _read_argument(node, readers)
        if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
            names.add(argument.value)
        elif isinstance(argument, ast.Name):
            names.update(loops.get(argument.id, []))
    return {n for n in names if re.fullmatch(r"[A-Z][A-Z0-9_]+", n)}


@cache
def settings_read_from_environment() -> frozenset[str]:
    names: set[str] = set()
    for package in CODE_PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            names |= _env_reads(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    return frozenset(names)


def test_the_walk_finds_the_settings_module_and_the_clients_reads() -> None:
    # The walk itself: if it found nothing, the tests below would pass on an empty set.
    found = settings_read_from_environment()
    assert {"DATABASE_URL", "GOODPUT_INGEST_QUEUE_BOUND", "GOODPUT_TRUSTED_PROXIES", "DEMO_PASSWORD"} <= found
    assert {"GOODPUT_AGENT_TOKEN", "GOODPUT_JOB_ID", "SLURM_JOB_ID", "NODE_NAME", "SLURMD_NODENAME"} <= found


def test_every_setting_the_code_reads_is_documented() -> None:
    manual = "\n".join(pages().values())
    missing = sorted(n for n in settings_read_from_environment() if not re.search(rf"\b{n}\b", manual))
    assert missing == [], f"read from the environment but in no page of docs/: {missing}"


def test_every_setting_the_manual_names_exists() -> None:
    known = settings_read_from_environment()
    code = source_text()
    make_variables = set(re.findall(r"\$\(([A-Z_]+)\)", (ROOT / "Makefile").read_text()))  # SOAK_ARGS
    wrong = []
    for name, text in pages_and_readme().items():
        for word in sorted(set(UPPER_NAME.findall(text)) - make_variables):
            if word.startswith(ENV_PREFIXES):
                exists = word in known or word.removesuffix("_FILE") in known
            else:
                exists = hasattr(settings, word) or re.search(rf"\b{word}\b", code) is not None
            if not exists:
                wrong.append(f"{name}.md: {word}")
    assert wrong == [], "named by the manual, unknown to the code:\n" + "\n".join(wrong)


def _concrete(path: str) -> list[str]:
    """'/api/v1/{incidents,silences}/<id>/?x=1' -> ['/api/v1/incidents/1/', '/api/v1/silences/1/']."""
    path = path.split("?")[0].split("#")[0].rstrip(".,;:")
    path = re.sub(r"<(\w+)>", lambda m: PLACEHOLDERS.get(m[1], "x"), path)
    if match := re.search(r"\{([^}]*)\}", path):
        return [p for choice in match[1].split(",") for p in _concrete(path.replace(match[0], choice, 1))]
    return [path]


def routes_named(text: str) -> set[str]:
    found: set[str] = set()
    for span in code_spans(text):
        for raw in PATH_IN_CODE.findall(span) + OWN_URL.findall(span):
            first = raw.strip("/").split("/")[0]
            if "..." in raw or "…" in raw or first in FILE_ROOTS or first.isdigit() or raw.startswith("//"):
                continue
            found.update(_concrete(raw))
    return found


def _route_prefixes(patterns: list[Any], prefix: str = "") -> Iterator[str]:
    """The literal start of every route (up to its first parameter), includes walked."""
    for pattern in patterns:
        route = prefix + str(pattern.pattern).removeprefix("^")
        yield "/" + re.split(r"[<(\\[$?]", route)[0]
        if isinstance(pattern, URLResolver):
            yield from _route_prefixes(pattern.url_patterns, route)


def _is_route(path: str) -> bool:
    try:
        resolve(path)
        return True
    except Resolver404:
        websockets = {"/" + str(p.pattern).removeprefix("^").removesuffix("$") for p in websocket_urlpatterns}
        return path in websockets or any(p.startswith(path) for p in _route_prefixes(get_resolver().url_patterns))


def test_every_route_the_manual_names_resolves() -> None:
    wrong = []
    for name, text in pages_and_readme().items():
        wrong += [f"{name}.md: {route}" for route in sorted(routes_named(text)) if not _is_route(route)]
    assert wrong == [], "routes named by the manual that the URL conf does not have:\n" + "\n".join(wrong)


def test_the_route_check_sees_routes_and_leaves_files_alone() -> None:
    text = "`/fleet/gpus/<uuid>/`, `POST /api/v1/{incidents,silences}/`, `/data`, `http://127.0.0.1:8000/healthz`"
    assert routes_named(text) == {
        "/fleet/gpus/GPU-00000000-0000-0000-0000-000000000000/",
        "/api/v1/incidents/",
        "/api/v1/silences/",
        "/healthz",
    }


def test_every_command_and_make_target_the_manual_names_exists() -> None:
    commands = set(get_commands())
    targets = set(re.findall(r"^([a-z-]+):", (ROOT / "Makefile").read_text(), flags=re.M))
    wrong = []
    for name, text in pages_and_readme().items():
        wrong += [f"{name}.md: manage.py {c}" for c in sorted(set(COMMAND.findall(text)) - commands)]
        wrong += [f"{name}.md: make {t}" for t in sorted(set(MAKE_TARGET.findall(text)) - targets)]
    assert wrong == []


def test_every_metric_and_series_the_manual_names_is_in_the_code() -> None:
    code = source_text()
    wrong = []
    for name, text in pages_and_readme().items():
        spans = {re.sub(r"\{.*\}$", "", span) for span in inline_code(text)}
        names = {span for span in spans if SERIES.match(span)}
        wrong += [f"{name}.md: {n}" for n in sorted(names - NOT_MAPPED) if n not in code]
    assert wrong == [], "metric and series names the code never uses:\n" + "\n".join(wrong)


# --- the pages, served ------------------------------------------------------------------------------


def _links(text: str) -> list[str]:
    tokens = docs._markdown().parse(text)
    return [
        str(child.attrGet("href") or child.attrGet("src"))
        for token in tokens
        for child in token.children or []
        if child.type in ("link_open", "image")
    ]


def _broken(link: str, base: Path) -> str | None:
    """Why a link of a page in `base` goes nowhere, or None."""
    if link.startswith(("http://", "https://", "mailto:")):
        return None
    target, _, anchor = link.partition("#")
    if not target:  # a heading of the same page: checked by the caller
        return None
    path = (base / target).resolve()
    if not path.is_file():
        return "no such file"
    in_manual = path.suffix == ".md" and path.parent == docs.DOCS_DIR
    if anchor and in_manual and anchor not in docs.heading_anchors(docs.parse(path.stem)):
        return f"{path.stem}.md has no heading #{anchor}"
    return None


def test_every_link_between_pages_reaches_a_page_and_heading() -> None:
    wrong = []
    for name, text in pages().items():
        own = docs.heading_anchors(docs.parse(name))
        for link in _links(text):
            if link.startswith("#"):
                why = None if link[1:] in own else "no such heading"
            else:
                why = _broken(link, docs.DOCS_DIR)
                if why is None and not re.match(r"^(https?://|[a-z0-9-]+\.md(#|$)|img/)", link):
                    why = "not a page of docs/: the console serves only those"
            if why:
                wrong.append(f"{name}.md -> {link}: {why}")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    wrong += [f"README.md -> {link}: {why}" for link in _links(readme) if (why := _broken(link, ROOT))]
    assert wrong == []


def test_the_readme_is_a_screen_and_its_screenshot_is_small() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 160
    screenshot = ROOT / "docs" / "img" / "overview.png"
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert screenshot.stat().st_size < 300 * 1024


@pytest.mark.django_db
def test_every_page_renders_for_a_signed_in_user(viewer_client: Client) -> None:
    for name in docs.page_names():
        response = viewer_client.get(f"/docs/{name}/")
        assert response.status_code == 200, name
        assert b'class="manual-page' in response.content
    index = viewer_client.get("/docs/")
    assert index.status_code == 200
    assert b"The Goodput manual" in index.content
    # links between pages point at the console's own URLs, anchors kept
    assert b'href="/docs/fleet/"' in viewer_client.get("/docs/api/").content
    assert b'href="/docs/numbers/#fleet"' in viewer_client.get("/docs/fleet/").content


@pytest.mark.django_db
def test_the_manual_is_closed_to_anyone_not_signed_in(anon_client: Client, norole_client: Client) -> None:
    for url in ("/docs/", "/docs/fleet/"):
        response = anon_client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/")
        assert norole_client.get(url).status_code == 403


@pytest.mark.django_db
def test_an_unknown_page_is_a_404(viewer_client: Client) -> None:
    assert viewer_client.get("/docs/no-such-page/").status_code == 404
    assert viewer_client.get("/docs/..%2Fsettings/").status_code == 404


@pytest.mark.django_db
def test_html_in_a_page_is_shown_as_text(
    viewer_client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "index.md").write_text("# Hi\n\n<script>alert(1)</script>\n\n[x](javascript:alert(1))\n")
    monkeypatch.setattr(docs, "DOCS_DIR", tmp_path)
    body = viewer_client.get("/docs/").content.decode()
    assert "<script>alert(1)</script>" not in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    assert 'href="javascript:' not in body


# Where the manual points into the code: a file (`fleet/training/goodput.py`) or a dotted name
# (`fleet.training.advisor.advise_job`, or Django's `fleet.ClaimConflict`) written as a code span.
CODE_FILE = re.compile(
    r"^(?:goodput|console|fleet|incidents|compliance|clients|bench|tests|templates|static)/[\w/-]*\.\w+$"
)
DOTTED = re.compile(r"^(?:goodput|console|fleet|incidents|compliance|clients)(?:\.\w+)+$")
CHECK_OR_FILE_NAME = re.compile(r"\.(?:[WE]\d{3}|py)$")  # `goodput.W101`, `goodput.py`


def _resolves(dotted: str) -> bool:
    """A module, or an attribute of one, or an app's model (`fleet.ClaimConflict`)."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for name in parts[split:]:
            if not hasattr(found, name):
                break
            found = getattr(found, name)
        else:
            return True
        break
    try:
        apps.get_model(dotted)
    except (LookupError, ValueError):
        return False
    return True


def test_every_file_and_module_the_manual_points_to_exists() -> None:
    """A file moved or a function renamed leaves the manual pointing at nothing: found here."""
    wrong = []
    for name, text in pages().items():
        for span in sorted(set(inline_code(text))):
            if CODE_FILE.match(span) and "..." not in span and not (ROOT / span).exists():
                wrong.append(f"{name}.md: {span} (no such file)")
            elif DOTTED.match(span) and not CHECK_OR_FILE_NAME.search(span) and not _resolves(span):
                wrong.append(f"{name}.md: {span} (nothing of that name)")
    assert wrong == [], "the manual points at code that is not there:\n" + "\n".join(wrong)
