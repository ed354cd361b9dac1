"""Alembic environment: runs on the connection the store hands over (see gateway.store.schema).

Run from the command line through `gatehouse db upgrade` (or `alembic` with `-x url=...`).
"""

from __future__ import annotations

from typing import Any, Literal

from alembic import context
from alembic.autogenerate.api import AutogenContext
from sqlalchemy import create_engine
from sqlalchemy.engine import Connection
from sqlmodel import SQLModel

import gateway.store.models  # noqa: F401  (registers the tables on SQLModel.metadata)

config = context.config
target_metadata = SQLModel.metadata
# APScheduler creates and owns its job table (`apscheduler_jobs`); migrations leave it alone.
FOREIGN_TABLES = {"apscheduler_jobs"}


def include_object(
    obj: object, name: str | None, type_: str, reflected: bool, other: object
) -> bool:
    return not (type_ == "table" and name in FOREIGN_TABLES)


def render_item(type_: str, obj: Any, _context: AutogenContext) -> str | Literal[False]:
    """Write SQLModel's column types as plain SQLAlchemy ones in generated migrations."""
    from sqlmodel.sql.sqltypes import AutoString, UTCDateTime

    if type_ == "type" and isinstance(obj, AutoString):
        return "sa.String()"
    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def migrate_on(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=True,
        include_object=include_object,
        render_item=render_item,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """On the store's connection (`gatehouse db upgrade`, every start), else on `-x url=...`."""
    connection = config.attributes.get("connection")
    if connection is not None:
        migrate_on(connection)
        return
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option(
        "sqlalchemy.url"
    )
    if not url:
        raise SystemExit("no database URL: use `gatehouse db upgrade` or `alembic -x url=...`")
    engine = create_engine(url)
    with engine.connect() as conn:
        migrate_on(conn)


if context.is_offline_mode():
    raise SystemExit("offline (SQL script) migrations are not supported; pass a database URL")
run_migrations_online()
