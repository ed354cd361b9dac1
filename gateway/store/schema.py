"""The schema's version: Alembic migrations, applied when the store opens.

A new database gets the current tables in one step and is stamped at the newest revision; an
existing one is upgraded. A database made before migrations existed has exactly the tables of
revision 0001, so it is stamped there and upgraded from it. On PostgreSQL an advisory lock
makes processes that start together migrate one at a time.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING

from sqlalchemy import Table, inspect, text
from sqlalchemy.engine import Connection
from sqlmodel import SQLModel

import gateway.store.models  # noqa: F401  (registers the tables)

if TYPE_CHECKING:  # Alembic is loaded by the functions that migrate (not for a job store)
    from alembic.config import Config as AlembicConfig

FIRST_REVISION = "0001"
_MIGRATION_LOCK = 0x6761746568  # "gateh": one advisory lock id for schema changes


def alembic_config(connection: Connection | None = None) -> AlembicConfig:
    from alembic.config import Config as AlembicConfig

    config = AlembicConfig()
    config.set_main_option(
        "script_location", str(resources.files("gateway.store") / "migrations")
    )
    if connection is not None:
        config.attributes["connection"] = connection
    return config


@lru_cache(maxsize=1)
def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def current_revision(connection: Connection) -> str | None:
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(connection).get_current_revision()


def create_table_once(connection: Connection, table: Table) -> None:
    """Create `table` if it is missing, under the schema-change lock on PostgreSQL: two
    processes starting at once on a new database must not both try (one would fail)."""
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": _MIGRATION_LOCK})
    table.create(connection, checkfirst=True)


HEAD_REVISION = "0008"
"""The newest migration (tests/gateway/store/test_schema.py holds it to Alembic's scripts): a
database already at it opens without loading Alembic, which every CLI command would pay."""


def migrate(connection: Connection) -> str:
    """Bring the database to the newest revision inside the caller's transaction; say what."""
    if _at_head(connection):
        return f"up to date at revision {HEAD_REVISION}"
    from alembic import command

    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": _MIGRATION_LOCK})
    tables = set(inspect(connection).get_table_names())
    config = alembic_config(connection)
    if "alembic_version" not in tables:
        if "sessions" not in tables:
            SQLModel.metadata.create_all(connection)
            command.stamp(config, head_revision())
            return f"created the tables at revision {head_revision()}"
        command.stamp(config, FIRST_REVISION)
    before = current_revision(connection)
    if before == head_revision():
        return f"up to date at revision {before}"
    command.upgrade(config, "head")
    return f"upgraded from revision {before} to {head_revision()}"


def _at_head(connection: Connection) -> bool:
    """The database's recorded revision is `HEAD_REVISION` (read without Alembic)."""
    if "alembic_version" not in inspect(connection).get_table_names():
        return False
    found = connection.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    return list(found) == [HEAD_REVISION]
