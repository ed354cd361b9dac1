"""An unstarted Discord adapter whose discord.py state knows the ids the recorded payloads in
`tests/channels/fixtures/discord_*.json` were written with, so tests can parse those payloads
(and fuzzed variants of them) with the real discord.py and normalize the result."""

from __future__ import annotations

from typing import Any

import discord

from channels.discord import DiscordChannel
from gateway.config import DiscordSettings
from tests.fakes.discord_server import FakeDiscord

# The ids the fixtures were written with (see the payloads): bot, guild, channel, thread, role.
FIXTURE_IDS = {
    "bot_id": "1180381729134280724",
    "guild_id": "1180381729134280700",
    "text_channel_id": "1180381729134280701",
    "thread_id": "1180381729134280702",
    "bot_role_id": "1180381729134280703",
    "owner_id": "1180381729134280704",
}
FIXTURE_ALICE = "1180381729134280710"


def fixture_channel() -> tuple[DiscordChannel, Any]:
    """An unstarted adapter whose discord.py state knows the bot user and the fixture guild."""
    fake = FakeDiscord()  # only its payload builders: never started
    for attr, value in FIXTURE_IDS.items():
        setattr(fake, attr, value)
    fake.app_id = fake.everyone_role_id = fake.guild_id
    fake.alice = fake.user(FIXTURE_ALICE, "alice", global_name="Alice A.")
    fake.bot_user = fake.user(fake.bot_id, "gatehouse", bot=True)
    chan = DiscordChannel(DiscordSettings(token="fixture-token"))
    client = chan._make_client()
    chan._client = client
    state = client._connection
    state.user = discord.ClientUser(state=state, data=fake.bot_user)  # type: ignore[arg-type]
    state._add_guild_from_data(fake.guild())  # type: ignore[arg-type]
    return chan, state
