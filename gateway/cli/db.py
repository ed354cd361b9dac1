"""`gatehouse db`: the database schema (Alembic migrations)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from gateway.cli.common import console, execute, fail, load, on_store, sub_app

if TYPE_CHECKING:
    from gateway.store import Store

app = sub_app("The database schema (Alembic migrations).")


@app.command("upgrade")
def db_upgrade() -> None:
    """Bring the database to the newest schema (every process also does this when it opens)."""
    from gateway.config import redacted_url

    config = load()

    async def schema_status(store: Store) -> str:
        return store.schema_status

    status = execute(on_store(schema_status), config=config)
    console.print(f"{redacted_url(config.database_url)}: {status}")


@app.command("current")
def db_current() -> None:
    """Show the database's schema revision and the newest one this release knows."""
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import OperationalError

    from gateway.config import redacted_url, sync_url
    from gateway.store.faults import database_where, storage_faults
    from gateway.store.schema import current_revision, head_revision

    config = load()
    url = sync_url(config.database_url)
    database = make_url(url).database
    if url.startswith("sqlite") and database and not Path(database).exists():
        console.print(f"no database yet at {database} (`gatehouse db upgrade` creates it)")
        raise typer.Exit(1)
    engine = create_engine(url)
    try:
        with storage_faults(database_where(config.database_url)), engine.connect() as conn:
            current = current_revision(conn)
    except OperationalError as exc:
        fail(f"cannot open {redacted_url(config.database_url)}", str(exc.orig), 1)
    finally:
        engine.dispose()
    head = head_revision()
    state_text = "up to date" if current == head else "needs `gatehouse db upgrade`"
    console.print(f"database revision: {current or '(none)'}; newest: {head} ({state_text})")
