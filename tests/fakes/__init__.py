"""Test doubles for Gatehouse's external dependencies: the fake OpenAI server is exported here;
the platform fakes live in `telegram_server`, `slack_server` and `discord_server`."""

from tests.fakes import openai_server
from tests.fakes.openai_server import *  # noqa: F403

__all__ = openai_server.__all__
