from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.browser.support import ARTIFACTS
from tests.conftest import redis_url
from tests.stack import Stack


@pytest.fixture
def stack(transactional_db: None, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Stack]:
    """A Celery worker and uvicorn on the (committed) test database and a flushed Redis.

    When the test fails, the worker's and the server's logs are copied to test-artifacts/.
    """
    log_dir = tmp_path / "stack-logs"
    log_dir.mkdir()
    stack = Stack(redis_url(), log_dir)
    stack.flush_redis()
    failed_before = request.session.testsfailed
    try:
        stack.start_worker()
        stack.start_server()
        yield stack
    finally:
        stack.stop()
        if request.session.testsfailed > failed_before:
            shutil.copytree(log_dir, ARTIFACTS / "stack-logs" / request.node.name, dirs_exist_ok=True)
