"""Logging: rich on a terminal, plain lines otherwise (CI, files, pipes); secrets redacted.

Every record goes through `SECRETS` on its way out: the configured credentials (bot tokens,
API keys, signing secrets, the admin token, passwords in URLs) are masked literally, and
anything that looks like a secret (the
same finders compaction uses: API keys, tokens, passwords, private keys) is replaced by a
``[REDACTED:<kind>]`` marker. That covers the SDKs' own debug lines too: python-telegram-bot
logs its Bot API URL, which contains the bot token, and the messages it sends and receives.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable

from rich.console import Console
from rich.logging import RichHandler

from context.secrets import redact_secrets
from gateway.config import Config, secret_values

NOISY = ("httpx", "httpx2", "openai", "aiosqlite", "sqlalchemy.engine")
"""Loggers kept at WARNING even at DEBUG: request bodies, SQL, connection chatter."""
CONFIG_MARKER = "[REDACTED:config]"
_MIN_LITERAL = 8  # shorter configured values ("x", "none") are placeholders, not secrets


class SecretFilter(logging.Filter):
    """Rewrites each record's message (and traceback) with secrets redacted."""

    def __init__(self) -> None:
        super().__init__()
        self.literals: list[str] = []

    def protect(self, values: Iterable[str | None]) -> None:
        """Mask these exact values wherever they appear (longest first)."""
        known = set(self.literals)
        known.update(v for v in values if v and len(v) >= _MIN_LITERAL)
        self.literals = sorted(known, key=len, reverse=True)

    def redact(self, text: str) -> str:
        for value in self.literals:
            if value in text:
                text = text.replace(value, CONFIG_MARKER)
        return redact_secrets(text)[0]

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = self.redact(record.getMessage()), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
            record.exc_info = None  # the redacted text is what gets printed
        if record.stack_info:
            record.stack_info = self.redact(record.stack_info)
        return True


SECRETS = SecretFilter()


def config_secrets(config: Config) -> list[str]:
    """The credentials a config holds: every secret key ([web] admin_token, [llm] and [context]
    API keys, every channel's tokens and secrets) and the passwords in its URLs (database_url,
    base_url...); see `gateway.config.secret_values`."""
    return secret_values(config)


def setup_logging(level: str = "INFO") -> None:
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    handler: logging.Handler
    if sys.stderr.isatty():
        handler = RichHandler(console=Console(stderr=True), show_path=False, rich_tracebacks=True)
        fmt = "%(message)s"
    else:
        handler = logging.StreamHandler(sys.stderr)
        fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    handler.setFormatter(logging.Formatter(fmt))
    handler.addFilter(SECRETS)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for noisy in NOISY:
        logging.getLogger(noisy).setLevel(logging.WARNING)
