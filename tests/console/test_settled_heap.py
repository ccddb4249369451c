"""The web process puts start-up's objects beyond the garbage collector once it is ready
(console.runtime.settle_heap): a full collection no longer walks them, so it stops pausing
requests and websocket pushes for tens of milliseconds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import gc, time
import goodput.asgi
frozen = gc.get_freeze_count()
import sys
views = sum(1 for name in sys.modules if name.endswith(".views"))
started = time.perf_counter()
gc.collect()
print(frozen, views, round((time.perf_counter() - started) * 1000, 3))
"""


def test_the_asgi_application_freezes_start_up_objects_views_included() -> None:
    environment = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "console.settings",
        "SECRET_KEY": "s",
        "ALLOWED_HOSTS": "console.example",
        "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15"),
        "DATABASE_URL": os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/postgres",
    }
    result = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    frozen, views, _ms = result.stdout.split()
    # Django, DRF, Channels and every view module: well over a hundred thousand objects.
    assert int(frozen) > 100_000
    # The URL patterns were read at start-up, so the views were imported before the freeze.
    assert int(views) >= 10


def test_settle_heap_leaves_what_requests_make_collectable() -> None:
    import gc
    import weakref

    from console.runtime import settle_heap

    class Cycle:
        pass

    try:
        settle_heap()
        a, b = Cycle(), Cycle()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        del a, b
        gc.collect()
        assert gone() is None  # a cycle made after the freeze is still collected
    finally:
        gc.unfreeze()
