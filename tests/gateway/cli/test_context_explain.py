"""`gatehouse context explain KEY` for a key nobody has written to yet: a preview of what the
first message would get (the history limit with its source, the window, the budget and the
thresholds), marked as a preview in text and JSON; a string that is no session key is one line
on stderr and exit 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gateway.config import load_config
from gateway.store import SessionInfo, Store
from tests.helpers.cli import in_process, write_config

LIMITS = """
[channels.slack]
dm_history_limit = 30
[channels.slack.dms."U7"]
history_limit = 5
[channels.telegram]
history_limit = 40
[channels.telegram.groups."-100"]
history_limit = 12
"""


async def explain_json(config: Path, key: str) -> dict[str, Any]:
    code, out, err = await in_process(config, "context", "explain", key, "--json", "--offline")
    assert code == 0, err
    data: dict[str, Any] = json.loads(out)
    return data


async def test_a_dm_with_a_per_user_limit_is_previewed_with_that_limit_and_its_source(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path, None, LIMITS)
    key = "agent:main:slack:direct:U7"
    code, out, err = await in_process(config, "context", "explain", key, "--offline")
    assert code == 0, err
    assert "preview: no messages yet" in out
    assert "last 5 user turns" in out and '[channels.slack.dms."U7"]' in out
    assert "Budget" in out and "compaction at" in out

    data = await explain_json(config, key)
    assert data["preview"] is True
    assert (data["platform"], data["chat_type"]) == ("slack", "direct")
    assert data["history_limit"] == 5
    assert data["history_limit_source"] == '[channels.slack.dms."U7"] history_limit'
    assert data["window"] > 0 and data["window_source"]
    assert 0 < data["flush_threshold"] < data["compaction_threshold"] <= data["window"]
    assert [line["name"] for line in data["budget"]][:2] == ["window", "reserve"]
    assert data["stored_messages"] == 0 and data["last_compaction"] is None

    # Another Slack user: the DM default; the same person on Telegram: the system default.
    other = await explain_json(config, "agent:main:slack:direct:U8")
    assert other["history_limit"] == 30
    assert other["history_limit_source"] == "[channels.slack] dm_history_limit"
    elsewhere = await explain_json(config, "agent:main:telegram:direct:U7")
    assert elsewhere["history_limit_source"].startswith("[context] history_limit")


async def test_a_group_thread_key_is_previewed_with_its_groups_limit(tmp_path: Path) -> None:
    config = write_config(tmp_path, None, LIMITS)
    data = await explain_json(config, "agent:main:telegram:group:-100:thread:7")
    assert data["preview"] is True and data["chat_type"] == "group"
    assert data["history_limit"] == 12
    assert data["history_limit_source"] == '[channels.telegram.groups."-100"] history_limit'
    plain = await explain_json(config, "agent:main:telegram:group:-200")
    assert (plain["history_limit"], plain["history_limit_source"]) == (
        40, "[channels.telegram] history_limit",
    )
    # A key this gateway would not build (per-user group sessions are off) says so.
    per_user = await explain_json(config, "agent:main:telegram:group:-100:user:9")
    assert any("per_user_in_groups" in note for note in per_user["notes"])


async def test_a_linked_person_is_previewed_through_the_identity_links(tmp_path: Path) -> None:
    links = '[sessions]\ndm_scope = "per-peer"\nidentity_links = { ann = ["slack:U7"] }\n'
    config = write_config(tmp_path, None, LIMITS + links)
    data = await explain_json(config, "agent:main:direct:ann")
    assert (data["platform"], data["history_limit"]) == ("slack", 5)
    unlinked = await explain_json(config, "agent:main:direct:slack+U8")
    assert unlinked["history_limit_source"] == "[channels.slack] dm_history_limit"


async def test_an_existing_session_is_explained_not_previewed(tmp_path: Path) -> None:
    config = write_config(tmp_path, None, LIMITS)
    key = "agent:main:slack:direct:U7"
    store = Store(load_config(config).database_url)
    await store.init()
    await store.ensure_session(
        SessionInfo(key=key, platform="slack", chat_type="direct", chat_id="D1")
    )
    await store.close()
    code, out, err = await in_process(config, "context", "explain", key, "--offline")
    assert code == 0, err
    assert "preview" not in out
    assert (await explain_json(config, key))["preview"] is False


async def test_a_malformed_key_is_one_line_and_exit_2(tmp_path: Path) -> None:
    config = write_config(tmp_path, None, LIMITS)
    for key, says in [
        ("main:slack:direct:U7", "is not a session key"),
        ("agent:main:webchat:direct:a@b", "must be written 'a%40b'"),
        ("agent:main:telegram:group:-100:thread", "is not a session key"),
        ("agent:main:slack:dorect", "is not a session key; the shapes are"),
    ]:
        code, out, err = await in_process(config, "context", "explain", key, "--offline")
        assert code == 2, (key, out, err)
        assert err.startswith("bad session key:") and says in " ".join(err.split())
        assert "Traceback" not in err + out and out == ""
    # The shapes are printed as written (no ":thread:" emoji).
    assert ":thread:<id>" in " ".join(err.split())
