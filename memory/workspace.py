"""The runtime workspace folder the agent and its people share.

Layout: `AGENTS.md` (from the template), `MEMORY.md`, `memory/` (daily notes), `artifacts/`
(full tool outputs too large for a prompt). Created by `gatehouse init` and on first run.

Every path the agent names goes through `resolve_in_workspace`: the agent's tools must never
reach outside this folder (no `..`, no absolute paths, no symlink escapes), and `MEMORY.md` /
`AGENTS.md` are curated by people, so the agent may only write under `memory/`.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import NamedTuple

MEMORY_TEMPLATE = """# MEMORY.md — long-term facts

Curated by people. The agent reads this file but does not edit it. Daily notes the agent writes
live in `memory/YYYY-MM-DD.md`.
"""

NOTES_DIR = "memory"
"""The only folder the agent may write to (daily notes)."""

READ_ONLY_NAMES = frozenset({"memory.md", "agents.md"})
"""Top-level files people curate; compared case-insensitively (macOS/Windows folds case)."""

TEXT_SUFFIXES: tuple[str, ...] = (".md", ".txt")

_WINDOWS_DRIVE = re.compile(r"^[A-Za-z]:")
_SEPARATORS = re.compile(r"[\\/]+")


INBOX_DIR = "inbox"
"""Files people sent, one folder per conversation (`conversation_folder`), then by day."""
ARTIFACTS_DIR = "artifacts"
"""Whole tool outputs too large for a prompt, one folder per conversation."""


def conversation_folder(session_key: str) -> str:
    """The folder of one conversation's files under inbox/ and artifacts/: readable (the key
    without its agent prefix) and unique per session key (a hash of the key ends it), so a
    file is found again only by the conversation it belongs to."""
    parts = session_key.split(":")
    readable = "-".join(parts[2:] if len(parts) > 2 and parts[0] == "agent" else parts)
    slug = re.sub(r"[^A-Za-z0-9_+-]+", "_", readable).strip("_-")[:48] or "session"
    digest = hashlib.sha256(session_key.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{slug}-{digest}"


class WorkspacePathError(ValueError):
    """A path the agent gave is not allowed; the message says why, for the model to read."""


@dataclass(frozen=True, slots=True)
class FileInfo:
    """One readable workspace file, as listed to the agent."""

    path: str  # relative to the workspace, POSIX separators
    size: int  # bytes
    modified: datetime  # UTC
    lines: int


def agents_template() -> str:
    """The default AGENTS.md shipped with Gatehouse (the repo's top-level AGENTS.md)."""
    return (resources.files("memory") / "templates" / "AGENTS.md").read_text(encoding="utf-8")


@contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on `path` (created if missing) for the block: other processes
    on this workspace wait, and so do other threads (each open is a lock of its own)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def ensure_workspace(path: Path) -> list[Path]:
    """Create whatever part of the workspace is missing; never overwrite. Return what was made."""
    created: list[Path] = []
    for folder in (path, path / "memory", path / "artifacts"):
        if not folder.is_dir():
            folder.mkdir(parents=True, exist_ok=True)
            created.append(folder)
    for name, text in (("AGENTS.md", agents_template()), ("MEMORY.md", MEMORY_TEMPLATE)):
        target = path / name
        try:  # "x": another process starting on this workspace may be writing it right now
            with target.open("x", encoding="utf-8") as file:
                file.write(text)
        except FileExistsError:
            continue
        created.append(target)
    return created


def _parts(relative: str) -> list[str]:
    """Split an agent-supplied path into checked components (both `/` and `\\` separate)."""
    if not isinstance(relative, str):
        raise WorkspacePathError(f"path must be a string, got {type(relative).__name__}")
    if not relative.strip():
        raise WorkspacePathError("path is empty; give a path relative to the workspace")
    if "\x00" in relative:
        raise WorkspacePathError("path contains a NUL byte")
    try:
        relative.encode("utf-8")
    except UnicodeEncodeError:
        raise WorkspacePathError("path is not valid Unicode text (lone surrogate)") from None
    if relative.startswith(("/", "\\")) or _WINDOWS_DRIVE.match(relative):
        raise WorkspacePathError(
            f"absolute paths are not allowed ({relative!r}); "
            "give a path relative to the workspace, e.g. 'memory/2025-01-31.md'"
        )
    if relative.startswith("~"):
        raise WorkspacePathError(f"home-relative paths are not allowed ({relative!r})")
    if ":" in relative:
        # Windows drive-relative paths and NTFS streams (`MEMORY.md::$DATA`) hide behind colons.
        raise WorkspacePathError(f"':' is not allowed in workspace paths ({relative!r})")
    parts = [part for part in _SEPARATORS.split(relative.strip()) if part not in ("", ".")]
    if any(part == ".." for part in parts):
        raise WorkspacePathError(f"'..' is not allowed in workspace paths ({relative!r})")
    if not parts:
        raise WorkspacePathError(f"{relative!r} names the workspace itself, not a file")
    return parts


def resolve_in_workspace(root: Path, relative: str, *, write: bool = False) -> Path:
    """The absolute, symlink-resolved path for `relative`, or WorkspacePathError.

    Checks the text first (cheap, clear messages), then the resolved path, which is what
    catches a symlink inside the workspace that points elsewhere. With `write=True` the target
    must also lie under `memory/` and must not be `MEMORY.md` or `AGENTS.md`.
    """
    parts = _parts(relative)
    base = root.resolve()
    try:
        target = base.joinpath(*parts).resolve()
    except (OSError, RuntimeError) as exc:  # symlink loop, name too long
        raise WorkspacePathError(f"{relative!r} cannot be resolved: {exc}") from exc
    if not target.is_relative_to(base):
        raise WorkspacePathError(
            f"{relative!r} leads outside the workspace (through a symlink); not allowed"
        )
    if write:
        inside = target.relative_to(base).parts
        if len(inside) == 1 and inside[0].rstrip(". ").lower() in READ_ONLY_NAMES:
            raise WorkspacePathError(
                f"{inside[0]} is read-only to the agent (people curate it); "
                f"append to today's note under {NOTES_DIR}/ instead"
            )
        notes = (base / NOTES_DIR).resolve()  # memory/ itself may be a symlink
        if not target.is_relative_to(notes) or target == notes:
            raise WorkspacePathError(
                f"the agent may only write under {NOTES_DIR}/ ({relative!r} is not there)"
            )
    return target


def relative_name(root: Path, path: Path) -> str:
    """`path` relative to the workspace with `/` separators (how paths are shown and indexed)."""
    return path.resolve().relative_to(root.resolve()).as_posix()


def split_lines(text: str) -> list[str]:
    """Lines as editors number them: only `\\n` (or `\\r\\n`) ends a line.

    `str.splitlines` also breaks on form feeds and U+2028, which would make our line numbers
    disagree with the editor a person uses to check them.
    """
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


class ScannedFile(NamedTuple):
    """A file found by `scan_workspace`: plain strings and ints, cheap enough to stat often."""

    rel: str  # relative to the workspace, POSIX separators
    path: str  # absolute
    size: int
    mtime_ns: int


def scan_workspace(
    root: Path,
    suffixes: Sequence[str] = TEXT_SUFFIXES,
    exclude_dirs: Sequence[str] = (),
) -> list[ScannedFile]:
    """Every text file under `root`, sorted, without reading them (the index stats this often).

    Hidden folders are skipped, symlinked folders are not entered (no loops, no escapes), and a
    symlinked file is kept only if it resolves inside the workspace. `exclude_dirs` are
    top-level folder names (e.g. `artifacts`).
    """
    base = root.resolve()
    wanted = tuple(suffix.lower() for suffix in suffixes)
    found: list[ScannedFile] = []
    pending: list[tuple[str, str]] = [(str(base), "")]
    while pending:
        folder, prefix = pending.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue  # unreadable or vanished
        for entry in entries:
            name = entry.name
            if name.startswith("."):
                continue
            try:
                if entry.is_dir(follow_symlinks=False):
                    if not (prefix == "" and name in exclude_dirs):
                        pending.append((entry.path, f"{prefix}{name}/"))
                    continue
                if not name.lower().endswith(wanted):
                    continue
                if not entry.is_file(follow_symlinks=False):
                    if not entry.is_symlink() or not entry.is_file():
                        continue  # not a regular file, or a link to something else
                    if not Path(entry.path).resolve().is_relative_to(base):
                        continue  # a link out of the workspace
                stat = entry.stat()
            except (OSError, RuntimeError):
                continue  # dangling link, link loop, or vanished mid-scan
            found.append(ScannedFile(prefix + name, entry.path, stat.st_size, stat.st_mtime_ns))
    found.sort(key=lambda item: item.rel)
    return found


def _count_lines(path: Path) -> int:
    count = 0
    last = b"\n"
    with path.open("rb") as handle:
        while block := handle.read(1 << 16):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (0 if last == b"\n" else 1)


def list_workspace_files(root: Path) -> list[FileInfo]:
    """Every `.md`/`.txt` file the agent may read, so it can pick one for `memory_get`."""
    infos: list[FileInfo] = []
    for found in scan_workspace(root):
        try:
            lines = _count_lines(Path(found.path))
        except OSError:
            continue
        modified = datetime.fromtimestamp(found.mtime_ns / 1e9, tz=UTC)
        infos.append(FileInfo(path=found.rel, size=found.size, modified=modified, lines=lines))
    return infos
