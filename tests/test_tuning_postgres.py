"""Two tuning workers sharing studies in a real PostgreSQL server (Optuna RDB storage).

`.ci/postgres` installs and starts a throwaway server on 127.0.0.1 and writes its URL to
/tmp/layoutgen_pg_url; `LAYOUTGEN_TEST_POSTGRES_URL` overrides.  Each test works in a fresh database that
it drops afterwards.  Without a reachable server the tests skip and say why.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import requires_interpreter
from test_tuning import private_cache, run_two_workers, tiny_options

URL_FILE = Path("/tmp/layoutgen_pg_url")
__all__ = ["private_cache"]  # the autouse fixture applies here too


def server_url() -> str:
    url = os.environ.get("LAYOUTGEN_TEST_POSTGRES_URL", "").strip()
    if not url and URL_FILE.is_file():
        url = URL_FILE.read_text(encoding="utf-8").strip()
    if not url:
        pytest.skip(f"no PostgreSQL server: run .ci/postgres (it writes {URL_FILE}) or set LAYOUTGEN_TEST_POSTGRES_URL")
    return url


@pytest.fixture
def fresh_database() -> Iterator[str]:
    """The URL of a new, empty database on the test server (dropped afterwards)."""
    psycopg2 = pytest.importorskip("psycopg2", reason="PostgreSQL tests need psycopg2 (pip install psycopg2-binary)")
    from sqlalchemy.engine import make_url

    url = make_url(server_url())
    try:
        admin = psycopg2.connect(
            host=url.host,
            port=url.port,
            user=url.username,
            password=url.password,
            dbname=url.database,
            connect_timeout=5,
        )
    except psycopg2.OperationalError as error:
        pytest.skip(f"PostgreSQL at {url.host}:{url.port} is not reachable ({str(error).strip()}); run .ci/postgres")
    admin.autocommit = True
    name = f"layoutgen_test_{uuid.uuid4().hex[:10]}"
    with admin.cursor() as cursor:
        cursor.execute(f'CREATE DATABASE "{name}"')
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@requires_interpreter
def test_two_workers_share_postgresql_studies_without_timing_a_config_twice(
    tmp_path: Path, fresh_database: str
) -> None:
    run_two_workers(tiny_options(tmp_path, workers=2, kernels=("pack", "combine"), trials=5, storage=fresh_database))
