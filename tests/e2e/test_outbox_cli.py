"""`gatehouse outbox`: replies a platform kept refusing are listed, retried or dropped offline."""

from __future__ import annotations

import json
from pathlib import Path

from context.types import Message
from gateway.config import load_config
from gateway.store import SessionInfo, Store, TurnUsage
from tests.helpers.cli import in_process, write_config
from tests.helpers.outbox import reply_to


async def stored_replies(config: Path) -> list[int]:
    """Two replies in the outbox; the first refused until it was given up."""
    store = Store(load_config(config).database_url)
    await store.init()
    try:
        session = await store.ensure_session(SessionInfo(key="k"))
        assert session.id is not None
        ids = []
        for text in ("blocked answer", "waiting answer"):
            outbox_id = await store.finish_turn(
                session.id, Message(role="assistant", content=text), [], TurnUsage(),
                outbound=reply_to(text),
            )
            assert outbox_id is not None
            ids.append(outbox_id)
        row = await store.outbox_failed(ids[0], 1, "Forbidden: bot was blocked", max_attempts=1)
        assert row is not None and row.given_up_at is not None
        return ids
    finally:
        await store.close()


async def test_given_up_replies_are_listed_retried_and_dropped(tmp_path: Path) -> None:
    config = write_config(tmp_path, None)
    blocked, waiting = await stored_replies(config)

    code, out, err = await in_process(config, "outbox", "list", "--json")
    assert code == 0, err
    rows = {r["id"]: r for r in json.loads(out)}
    assert rows[blocked]["state"] == "given up" and rows[blocked]["attempts"] == 1
    assert rows[blocked]["sent_parts"] == 1
    assert rows[blocked]["last_error"] == "Forbidden: bot was blocked"
    assert rows[waiting]["state"] == "waiting" and rows[waiting]["attempts"] == 0
    code, out, _ = await in_process(config, "outbox", "list")
    assert "given up" in out and "blocked answer" in out and "Forbidden" in out

    code, out, _ = await in_process(config, "doctor", "--json")
    [warning] = [c for c in json.loads(out)["checks"] if c["name"] == "outbox"]
    assert warning["status"] == "warning" and "1 reply never reached" in warning["detail"]

    code, _, err = await in_process(config, "outbox", "retry")
    assert code == 2 and "--all" in err
    code, out, err = await in_process(config, "outbox", "retry", "--all")
    assert code == 0 and "1 reply will be sent again" in out, err
    assert "within 15 s" in " ".join(out.split())  # the sweep of a running gateway
    code, out, _ = await in_process(config, "outbox", "list", "--json")
    assert {r["state"] for r in json.loads(out)} == {"waiting"}

    code, out, err = await in_process(config, "outbox", "drop", str(waiting), "999")
    assert code == 1 and "dropped 1 reply" in out and "not in the outbox" in err
    code, out, _ = await in_process(config, "outbox", "list", "--json")
    assert [r["id"] for r in json.loads(out)] == [blocked]
    code, out, _ = await in_process(config, "outbox", "drop", str(blocked))
    code, out, _ = await in_process(config, "outbox", "list")
    assert code == 0 and "the outbox is empty" in out
