"""Serve Plotly's bundle from the installed plotly package, compressed and cached for good.

``{% static 'vendor/plotly.min.js' %}`` names ``vendor/plotly.min.<hash>.js``, where the hash is
of the file's content. WhiteNoise then sends it with ``Cache-Control: immutable`` (it recognises
a hashed name that the storage maps back to the plain one), and sends the gzip'd copy kept next
to it to every browser that accepts gzip: 4.8 MB becomes about 1.4 MB, once per Plotly version.
No collectstatic step is needed: the copy is made under DATA_DIR the first time it is asked for.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.staticfiles.finders import BaseFinder
from django.contrib.staticfiles.storage import StaticFilesStorage
from django.core.files.storage import FileSystemStorage

PLOTLY_PATH = "vendor/plotly.min.js"


def _write_atomically(path: Path, write: Any) -> None:
    # Several processes (uvicorn workers, Celery) may start at once: each writes its own
    # temporary file and renames it into place, so no reader sees half a file.
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as tmp:
        write(tmp)
    os.replace(tmp.name, path)
    path.chmod(0o644)


@functools.cache
def plotly_bundle() -> Path:
    """Plotly's bundle under its content-hashed name, with a .gz beside it (made once)."""
    source = settings.PLOTLY_JS_DIR / "plotly.min.js"
    digest = hashlib.md5(source.read_bytes(), usedforsecurity=False).hexdigest()[:12]
    target = settings.DATA_DIR / "static-vendor" / "vendor" / f"plotly.min.{digest}.js"
    if not target.exists() or not target.with_name(target.name + ".gz").exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with source.open("rb") as src:
            _write_atomically(target, lambda out: shutil.copyfileobj(src, out))
        with source.open("rb") as src:

            def compress(out: Any) -> None:
                with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=9, mtime=0) as gz:
                    shutil.copyfileobj(src, gz)

            _write_atomically(target.with_name(target.name + ".gz"), compress)
    return target


def plotly_name() -> str:
    return f"vendor/{plotly_bundle().name}"


class ConsoleStaticFilesStorage(StaticFilesStorage):
    """Django's plain storage, except that Plotly's URL carries the hash of its content."""

    def url(self, name: str | None) -> str:
        return super().url(plotly_name() if name == PLOTLY_PATH else name)


class PlotlyFinder(BaseFinder):
    def check(self, **kwargs: Any) -> list[Any]:
        return []

    def find(self, path: str, find_all: bool = False, **kwargs: Any) -> Any:
        if path not in (PLOTLY_PATH, plotly_name()):
            return [] if find_all else None
        match = str(plotly_bundle())
        return [match] if find_all else match

    def list(self, ignore_patterns: Any) -> Any:
        # WhiteNoise (and collectstatic) see vendor/plotly.min.<hash>.js and its .gz. Listing
        # the .gz matters: WhiteNoise, reading files from finders, offers a compressed copy only
        # if it was listed too (it then serves it as the plain file's gzip encoding, never alone).
        storage = FileSystemStorage(location=str(plotly_bundle().parent))
        storage.prefix = "vendor"  # type: ignore[attr-defined]
        yield plotly_bundle().name, storage
        yield plotly_bundle().name + ".gz", storage
