"""The schema's version: Alembic migrations, applied when the store opens.

A new database gets the current tables in one step and is stamped at the newest revision; an
existing one is upgraded. A database made before migrations existed has exactly the tables of
revision 0001, so it is stamped there and upgraded from it. On PostgreSQL an advisory lock
makes processes that start together migrate one at a time.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Table, inspect, text
from sqlalchemy.engine import Connection
from sqlmodel import SQLModel

import gateway.store.models  # noqa: F401  (registers the tables)

FIRST_REVISION = "0001"
_MIGRATION_LOCK = 0x6761746568  # "gateh": one advisory lock id for schema changes


def alembic_config(connection: Connection | None = None) -> AlembicConfig:
    config = AlembicConfig()
    config.set_main_option(
        "script_location", str(resources.files("gateway.store") / "migrations")
    )
    if connection is not None:
        config.attributes["connection"] = connection
    return config


@lru_cache(maxsize=1)
def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def current_revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


def create_table_once(connection: Connection, table: Table) -> None:
    """Create `table` if it is missing, under the schema-change lock on PostgreSQL: two
    processes starting at once on a new database must not both try (one would fail)."""
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": _MIGRATION_LOCK})
    table.create(connection, checkfirst=True)


def migrate(connection: Connection) -> str:
    """Bring the database to the newest revision inside the caller's transaction; say what."""
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
