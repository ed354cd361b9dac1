"""Migrations: a new database, an upgraded one and a pre-migration one end with the same schema."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Column, Integer, MetaData, Table, create_engine, inspect, text
from sqlmodel import SQLModel

from gateway.config import sync_url
from gateway.store import SessionInfo, Store
from gateway.store.schema import FIRST_REVISION, HEAD_REVISION, create_table_once, head_revision
from tests.postgres import ThrowawayPostgres

FIRST_RELEASE_TABLES = ("sessions", "messages", "compactions", "pairings")


def _differences(url: str) -> list[object]:
    engine = create_engine(Store(url).url)
    with engine.connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn), SQLModel.metadata)
    engine.dispose()
    return list(diffs)


def test_the_head_written_down_is_the_newest_migration() -> None:
    """A database at `HEAD_REVISION` opens without Alembic: the constant must name the newest
    script (bump it with each migration)."""
    assert head_revision() == HEAD_REVISION


async def test_new_database_is_created_at_head(database_url: str) -> None:
    store = Store(database_url)
    await store.init()
    assert store.schema_status == f"created the tables at revision {head_revision()}"
    await store.close()
    assert _differences(database_url) == []
    again = Store(database_url)
    await again.init()
    assert again.schema_status == f"up to date at revision {head_revision()}"
    await again.close()


async def test_migrations_from_nothing_match_the_models(database_url: str) -> None:
    from alembic import command

    from gateway.store.schema import alembic_config

    target = Store(database_url)
    if target.path is not None:
        target.path.parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(target.url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "head")
    engine.dispose()
    assert _differences(database_url) == []


async def test_database_from_before_migrations_is_adopted(tmp_path: Path) -> None:
    from alembic import command

    from gateway.store.schema import alembic_config

    path = tmp_path / "old.db"
    url = f"sqlite:///{path}"
    engine = create_engine(url)
    # The first release's tables as they were (revision 0001: later migrations add columns to
    # them, so today's models would not do), and no version table then.
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), FIRST_REVISION)
        conn.execute(text("DROP TABLE alembic_version"))
        assert set(inspect(conn).get_table_names()) == set(FIRST_RELEASE_TABLES)
    engine.dispose()
    store = Store(url)
    await store.init()
    assert store.schema_status.startswith(f"up to date at revision {FIRST_REVISION}") or (
        store.schema_status == f"upgraded from revision {FIRST_REVISION} to {head_revision()}"
    )
    await store.ensure_session(SessionInfo(key="k"))
    await store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchone()[0] == (
            head_revision()
        )


def test_processes_starting_at_once_create_a_table_once(postgres: ThrowawayPostgres) -> None:
    """APScheduler's own check-then-create races on a new database; ours takes the lock."""
    engine = create_engine(sync_url(postgres.new_database()))
    barrier = threading.Barrier(6)
    errors: list[BaseException] = []

    def start() -> None:
        table = Table("apscheduler_jobs", MetaData(), Column("id", Integer, primary_key=True))
        barrier.wait()
        try:
            with engine.begin() as connection:
                create_table_once(connection, table)
        except BaseException as exc:  # collected: the assertion below names it
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    engine.dispose()
    assert errors == []
