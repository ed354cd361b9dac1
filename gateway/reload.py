"""Reloading the config in a running gateway (SIGHUP, `gatehouse reload`): what changes, what
needs a restart, and applying the reloadable keys in place (history limits, access lists,
mid-turn modes)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel

from channels.settings import ChannelSection, HistoryOverride
from gateway.config import ChannelsSection, Config

RELOADABLE_LIMITS = ("history_limit", "dm_history_limit", "dms", "groups", "channels")
"""A channel's history-limit keys (with `[context] history_limit`): a reload applies them."""
RELOADABLE_ACCESS = ("dm_policy", "allow_from", "group_allowlist", "require_mention")
"""A channel's access keys: a reload applies them."""
RELOADABLE_MODES = ("queue_mode",)
"""How a channel treats messages that arrive mid-turn (with `[gateway] queue_mode`): read at
every turn, so a reload applies them too."""


@dataclass(frozen=True, slots=True)
class ReloadPlan:
    """What a reload changes in a running gateway, and what it cannot."""

    changes: list[str] = field(default_factory=list)
    """One line per kind, e.g. "history limits: telegram dm 40 → 30"."""
    restart: list[str] = field(default_factory=list)
    """The other keys that differ from the file the gateway started with (names only: a value
    may be a secret): kept as they were until a restart."""


def _limit_text(value: int | None) -> str:
    return "unset" if value is None else "unlimited" if value == 0 else str(value)


def _limits(section: ChannelSection, table: str) -> dict[str, int | None]:
    overrides: dict[str, HistoryOverride] = getattr(section, table, None) or {}
    return {key: item.history_limit for key, item in overrides.items()}


def _list_change(name: str, key: str, old: list[str], new: list[str]) -> str | None:
    added = [x for x in new if x not in old]
    removed = [x for x in old if x not in new]
    if not added and not removed:
        return None
    parts = [f"+{x}" for x in added] + [f"-{x}" for x in removed]
    return f"{name} {key} {' '.join(parts)}"


def reload_plan(running: Config, started_from: Config, new: Config) -> ReloadPlan:
    """What reloading `new` changes in the `running` config (history limits and access lists),
    and which other keys of the file differ from `started_from` (the file as the gateway read it
    at start or at its last reload) and so need a restart."""
    limits: list[str] = []
    access: list[str] = []
    modes: list[str] = []
    if running.gateway.queue_mode != new.gateway.queue_mode:
        modes.append(f"default {running.gateway.queue_mode} → {new.gateway.queue_mode}")
    if running.context.history_limit != new.context.history_limit:
        limits.append(
            f"default {_limit_text(running.context.history_limit)} → "
            f"{_limit_text(new.context.history_limit)}"
        )
    for name in ChannelsSection.model_fields:
        old, now = running.channels.get(name), new.channels.get(name)
        for key, label in (("dm_history_limit", "dm"), ("history_limit", "groups")):
            before, after = getattr(old, key), getattr(now, key)
            if before != after:
                limits.append(f"{name} {label} {_limit_text(before)} → {_limit_text(after)}")
        for table, label in (("dms", "dm"), ("groups", "group"), ("channels", "channel")):
            before_t, after_t = _limits(old, table), _limits(now, table)
            for key in sorted(before_t.keys() | after_t.keys()):
                if before_t.get(key) != after_t.get(key):
                    limits.append(
                        f"{name} {label} {key} {_limit_text(before_t.get(key))} → "
                        f"{_limit_text(after_t.get(key))}"
                    )
        if old.dm_policy != now.dm_policy:
            access.append(f"{name} dm_policy {old.dm_policy} → {now.dm_policy}")
        for key in ("allow_from", "group_allowlist"):
            line = _list_change(name, key, getattr(old, key), getattr(now, key))
            if line:
                access.append(line)
        if old.queue_mode != now.queue_mode:
            modes.append(f"{name} {old.queue_mode or 'default'} → {now.queue_mode or 'default'}")
        if old.require_mention != now.require_mention:
            access.append(
                f"{name} require_mention {str(old.require_mention).lower()} → "
                f"{str(now.require_mention).lower()}"
            )
    changes = []
    if limits:
        changes.append("history limits: " + ", ".join(limits))
    if access:
        changes.append("access: " + "; ".join(access))
    if modes:
        changes.append("mid-turn modes: " + ", ".join(modes))
    return ReloadPlan(changes, _restart_keys(started_from, new))


def _reloadable(path: tuple[str, ...]) -> bool:
    if path in (("context", "history_limit"), ("gateway", "queue_mode")):
        return True
    return (
        len(path) == 3 and path[0] == "channels"
        and path[2] in (*RELOADABLE_LIMITS, *RELOADABLE_ACCESS, *RELOADABLE_MODES)
    )


def _restart_keys(old: BaseModel, new: BaseModel, path: tuple[str, ...] = ()) -> list[str]:
    found: list[str] = []
    for name in type(old).model_fields:
        if name == "source" or _reloadable((*path, name)):
            continue
        before, after = getattr(old, name), getattr(new, name)
        if isinstance(before, BaseModel) and isinstance(after, BaseModel):
            found += _restart_keys(before, after, (*path, name))
        elif before != after:
            found.append(".".join((*path, name)))
    return found


def apply_reload(running: Config, new: Config) -> None:
    """Copy the reloadable keys (history limits, access lists, mid-turn modes) of `new` into `running`, in
    place: everything holding the running config sees them at its next read."""
    running.context.history_limit = new.context.history_limit
    running.gateway.queue_mode = new.gateway.queue_mode
    for name in ChannelsSection.model_fields:
        target, source = running.channels.get(name), new.channels.get(name)
        for key in (*RELOADABLE_LIMITS, *RELOADABLE_ACCESS, *RELOADABLE_MODES):
            if key in type(target).model_fields:
                setattr(target, key, getattr(source, key))
