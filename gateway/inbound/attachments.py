"""Attachments people send: stored with their message, downloaded after, saved to the inbox.

What happens to a message that carries files (photos, documents, voice notes):

1. `AttachmentIntake.arrival` gives the content it is stored with, at once, before anything is
   downloaded (nothing is lost if a download hangs or the process dies): its text, a line per
   file, and what is needed to fetch them. The row waits out of every turn's claim
   (`FETCHING_STATUS`; gateway/store/attachments.py). An unmentioned group message (kept as
   context only) is stored with its lines and nothing is downloaded.
2. `fetch` downloads in the background, so the platform's ack never waits for a file: each
   through its own channel (`channels.attachments.FetchesAttachments`, the platform's API),
   refused beyond ``[attachments] max_bytes``, typed by its content (`channels.filetypes.sniff`,
   never by its name alone), saved as ``inbox/YYYY-MM-DD/<platform>-<sender>-<id>-<name>``
   (every part sanitised, the date in the gateway's timezone, confined to the workspace).
3. The message is completed with a line per file telling the agent what arrived and where::

       [attachment: photo.jpg, image/jpeg, 120 KB, saved to inbox/2026-05-01/telegram-7-42-0-photo.jpg]

   and, for a model configured with ``[llm] vision = true``, each image as an image part (a
   ``workspace:`` URL the model provider sends as a data URL; gateway/model/images.py). Then a
   turn answers it like any message.
4. A message with nothing the model can use -- no text, and only images a model without vision
   cannot see, audio, video, or files that could not be saved -- is answered at once in plain
   words instead ("I received your photo (saved to inbox/…) but this model cannot see images."),
   stored with its reply like a turn's. Never a silent drop, never "your message was empty".

A failed download is one log line and a line for the agent (or the plain answer) saying why.
After a stop or crash, `resume` finishes what was left fetching.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import unicodedata
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any
from zoneinfo import ZoneInfo

from channels.attachments import (
    WORKSPACE_IMAGE_PREFIX,
    AttachmentInfo,
    AttachmentTooLarge,
    AttachmentUnavailable,
    FetchesAttachments,
    describe,
)
from channels.base import InboundMessage, OutboundMessage
from channels.filetypes import VISION_TYPES, FileType, extension_fits, sniff
from context.types import Message
from gateway.config import Config
from gateway.inbound.lanes import finish_or_cancel
from gateway.store import MessageRow, Store
from gateway.store.messages import CONTEXT_STATUS, FETCHING_STATUS
from memory.workspace import (
    INBOX_DIR,
    WorkspacePathError,
    conversation_folder,
    resolve_in_workspace,
)

__all__ = [
    "INBOX_DIR",
    "PENDING_PART",
    "AttachmentIntake",
    "Outcome",
    "inbox_bytes",
    "inbox_name",
    "prune_inbox",
]

log = logging.getLogger(__name__)

PENDING_PART = "gatehouse.attachments"
"""The content part of a fetching message that holds its text and its attachment dicts."""
_NAME_CHARS = 80
_ID_CHARS = 40
_FILENAME_BYTES = 200

NotifyLane = Callable[[str], None]
HoldLane = Callable[[str], AbstractAsyncContextManager[None]]
SendStored = Callable[[int, OutboundMessage], Awaitable[None]]
CountTokens = Callable[[Message], int]


# -- names ------------------------------------------------------------------------------------


def _safe(text: str, limit: int) -> str:
    """Letters, digits, ``.``, ``_`` and ``-`` only (no separator, no leading dot: never a
    path of its own), at most `limit` characters."""
    text = unicodedata.normalize("NFKC", text)
    out = "".join(c if c.isalnum() or c in "._-" else "_" for c in text)
    return re.sub(r"_{2,}", "_", out).strip("._-")[:limit].rstrip("._-")


def _fit_bytes(text: str, limit: int) -> str:
    while len(text.encode("utf-8")) > limit:
        text = text[:-1]
    return text


def inbox_name(
    platform: str,
    sender_id: str,
    file_key: str,
    name: str | None,
    filetype: FileType,
    fallback: str,
) -> str:
    """The file name an attachment is saved under: ``<platform>-<sender>-<id>-<name>``.

    Each part sanitised (`_safe`). The name keeps its extension only when that is honest for the
    sniffed content (`extension_fits`); otherwise the content's own is added (``cat.jpg`` that is
    HTML becomes ``cat.jpg.html``, an executable ``.bin``)."""
    base = PurePosixPath((name or "").replace("\\", "/")).name
    safe = _safe(base, _NAME_CHARS) or fallback
    stem, dot, ext = safe.rpartition(".")
    if not (dot and stem):
        stem, ext = safe, ""
    extension = f".{ext.lower()}" if ext else ""
    if not extension_fits(extension, filetype):
        stem, extension = safe, filetype.extension  # the name as sent, then what it is
    prefix = "-".join(
        _safe(part, _ID_CHARS) or "x" for part in (platform, sender_id, file_key)
    )
    budget = _FILENAME_BYTES - len(f"{prefix}-".encode()) - len(extension.encode())
    return f"{prefix}-{_fit_bytes(stem, budget) or fallback}{extension}"


def _label(name: str | None, fallback: str) -> str:
    """How an attachment is named in a note: its name as sent, on one line, brackets softened;
    a voice note by what it is (Discord names every one ``voice-message.ogg``)."""
    if fallback == "voice note" and (name or "").lower().startswith("voice-message"):
        return fallback
    name = PurePosixPath((name or "").replace("\\", "/")).name  # a path in a name says nothing
    if not name:
        return fallback
    shown = "".join(" " if unicodedata.category(c)[0] in "CZ" else c for c in name)
    shown = re.sub(r"\s+", " ", shown).strip().replace("[", "(").replace("]", ")")
    return (shown[:_NAME_CHARS] + "…") if len(shown) > _NAME_CHARS else (shown or fallback)


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} byte{'s' if n != 1 else ''}"
    if n < 1024 * 1024:
        return f"{max(1, round(n / 1024))} KB"
    return f"{n / (1024 * 1024):.1f} MB"


# -- what became of each attachment -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Outcome:
    """One attachment after the download: saved (`relative`, `filetype`) or not (`problem`)."""

    label: str
    kind: str
    """photo, image, voice note, audio, video or file: what people call it."""
    relative: str | None = None
    filetype: FileType | None = None
    size: int | None = None
    claimed: str | None = None
    """The type the platform or the name claimed, when the content is something else."""
    problem: str | None = None
    too_large: bool = False

    def usable(self, vision: bool) -> bool:
        """Whether the model can do something with it (read it as an image, or as a file it
        was told about); audio, video and images it cannot see are not."""
        if self.filetype is None:
            return False
        if self.filetype.kind == "image":
            return vision and self.filetype.mime in VISION_TYPES
        return self.filetype.kind not in ("audio", "video")

    def image_part(self, vision: bool) -> dict[str, Any] | None:
        if not (vision and self.usable(vision) and self.filetype and self.relative):
            return None
        if self.filetype.kind != "image":
            return None
        return {"type": "image_url", "image_url": {"url": WORKSPACE_IMAGE_PREFIX + self.relative}}

    def note(self, vision: bool) -> str:
        """The line the agent reads about it."""
        if self.problem is not None or self.filetype is None or self.relative is None:
            size = f", {_size(self.size)}" if self.size is not None else ""
            return f"[attachment: {self.label}{size}: not saved, {self.problem or 'unknown'}]"
        mime = self.filetype.mime
        if self.claimed:
            mime += f" (sent as {self.claimed})"
        size = f", {_size(self.size)}" if self.size is not None else ""
        remark = ""
        kind = self.filetype.kind
        if kind == "image" and not self.usable(vision):
            remark = (
                "; this model cannot see images" if not vision
                else f"; the model cannot see {self.filetype.mime} images"
            )
        elif kind == "audio":
            remark = "; audio cannot be listened to yet"
        elif kind == "video":
            remark = "; video cannot be watched yet"
        return f"[attachment: {self.label}, {mime}{size}, saved to {self.relative}{remark}]"

    def plain(self, vision: bool, limit: int) -> str:
        """What the person is told when the model is not asked (see the module doc, 4.)."""
        what = f"your {self.kind}" if self.label == self.kind else self.label
        if self.too_large:
            if self.size is None:
                return f"I could not take {what}: it is larger than {_size(limit)}, the most I take."
            return (
                f"I could not take {what}: it is {_size(self.size)}, and files may be at most "
                f"{_size(limit)}."
            )
        if self.problem is not None or self.filetype is None:
            return f"I could not get {what}: {self.problem}. Please try sending it again."
        saved = f"I received {what} (saved to {self.relative})"
        kind = self.filetype.kind
        if kind == "audio":
            return f"{saved} but I cannot listen to audio yet."
        if kind == "video":
            return f"{saved} but I cannot watch videos yet."
        if vision:
            return f"{saved} but I cannot see {self.filetype.mime} images; JPEG or PNG works."
        return f"{saved} but this model cannot see images."


def _kind(info: AttachmentInfo, filetype: FileType | None) -> str:
    """What people call the attachment, from its content (or, before, from what is claimed)."""
    kind = filetype.kind if filetype is not None else None
    claimed = (info.mime or "").split("/", 1)[0]
    name = (info.name or "").lower()
    if info.kind == "voice" or name.startswith("voice-message") or (
        info.kind is None and claimed == "audio" and name.startswith("voice")
    ):
        return "voice note" if kind in (None, "audio") else "file"
    if kind == "image" or (kind is None and (info.kind == "photo" or claimed == "image")):
        return "photo" if info.kind == "photo" else "image"
    if kind == "audio" or (kind is None and (info.kind == "audio" or claimed == "audio")):
        return "audio file"
    if kind == "video" or (kind is None and (info.kind == "video" or claimed == "video")):
        return "video"
    return "file"


def _family(mime: str) -> str:
    """Types that may stand for one another when claimed (image/jpg for image/jpeg, audio/webm
    for video/webm, text/markdown for text/plain); active content is a family of its own."""
    if mime in ("text/html", "application/xhtml+xml", "image/svg+xml"):
        return "active"
    top = mime.split("/", 1)[0]
    if top in ("audio", "video"):
        return "media"
    if top == "text" or mime in ("application/json", "application/xml"):
        return "text"
    return top if top == "image" else mime


def _claimed_type(info: AttachmentInfo, filetype: FileType) -> str | None:
    """The type the sender's side claimed (the platform's, else the name's extension), when the
    content turned out to be something else."""
    claimed = (info.mime or "").split(";", 1)[0].strip().lower()
    if claimed and claimed not in ("application/octet-stream", "binary/octet-stream"):
        if _family(claimed) != _family(filetype.mime):
            return claimed
    ext = PurePosixPath((info.name or "").replace("\\", "/")).suffix.lower()
    if ext and not extension_fits(ext, filetype):
        return f"a {ext} file"
    if info.kind == "photo" and filetype.kind != "image":
        return "a photo"
    return None


def inbox_bytes(workspace: Path) -> int:
    """The bytes every file under inbox/ holds (for the quota; files that vanish meanwhile are
    not counted)."""
    total = 0
    for path in (workspace / INBOX_DIR).rglob("*"):
        with contextlib.suppress(OSError):
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
    return total


def prune_inbox(workspace: Path, older_than: datetime) -> tuple[int, int]:
    """Delete inbox files last modified before `older_than`, and the folders they leave
    empty; (files, bytes) deleted. The messages that named them keep their text."""
    files = freed = 0
    root = workspace / INBOX_DIR
    cutoff = older_than.timestamp()
    for path in sorted(root.rglob("*"), reverse=True):  # files before their folders
        with contextlib.suppress(OSError):
            if path.is_symlink() or path.is_file():
                info = path.lstat()
                if info.st_mtime < cutoff:
                    path.unlink()
                    files += 1
                    freed += info.st_size
            elif path.is_dir() and not any(path.iterdir()):
                path.rmdir()
    return files, freed


def _save(workspace: Path, relative: str, data: bytes) -> None:
    """Write `data` at `relative` inside the workspace: confined (a symlinked inbox/ pointing
    elsewhere is refused), whole or not at all (a temporary file, then a rename)."""
    target = resolve_in_workspace(workspace, relative)
    target.parent.mkdir(parents=True, exist_ok=True)
    target = resolve_in_workspace(workspace, relative)  # again: a link made meanwhile
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.part")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


_SURROGATE = re.compile("[\ud800-\udfff]")


def _storable(attachment: Mapping[str, Any]) -> dict[str, Any]:
    """An adapter's attachment dict as the store can keep it: plain values only, text without
    NULs or unpaired surrogates (JSON in PostgreSQL takes neither)."""
    out: dict[str, Any] = {}
    for key, value in attachment.items():
        if isinstance(value, str):
            value = _SURROGATE.sub("\ufffd", value).replace("\x00", "")
        elif not (value is None or isinstance(value, int)):
            continue
        if isinstance(key, str):
            out[key] = value
    return out


def _text_of(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content
                         if isinstance(p, dict) and p.get("type") == "text")
    return content if isinstance(content, str) else ""


def _pending_part(content: Any) -> dict[str, Any] | None:
    if isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and part.get("type") == PENDING_PART:
                return part
    return None


@dataclass(frozen=True, slots=True)
class _Waiting:
    """A stored message whose attachments are to be fetched, and where its answer goes."""

    message_id: int
    session_id: int
    session_key: str
    platform: str
    chat_id: str
    thread_id: str | None
    account: str
    sender_id: str
    platform_message_id: str | None
    text: str
    alone: bool
    received: float
    attachments: tuple[Mapping[str, Any], ...]


class AttachmentIntake:
    """Fetches, saves and describes the attachments of stored messages (see the module doc)."""

    def __init__(
        self,
        config: Config,
        store: Store,
        channels: Mapping[str, object],
        *,
        notify: NotifyLane,
        hold: HoldLane,
        send_stored: SendStored,
        count_tokens: CountTokens,
    ) -> None:
        self.config = config
        self.store = store
        self.channels = channels
        self._notify = notify
        self._hold = hold
        self._send_stored = send_stored
        self._count_tokens = count_tokens
        self._tasks: set[asyncio.Task[None]] = set()
        self._active: set[int] = set()
        self._closed = False

    @property
    def vision(self) -> bool:
        return self.config.llm.vision

    # -- on arrival ---------------------------------------------------------------------------

    def arrival(
        self, msg: InboundMessage, *, alone: bool, as_context: bool
    ) -> tuple[str | None, Any]:
        """(status, content) to store a message with attachments under: kept as context with a
        line per file (nothing downloaded), or fetching with what `fetch` needs."""
        attachments = [_storable(a) for a in msg.attachments]
        infos = [describe(a) for a in attachments]
        if as_context:
            lines = [
                f"[attachment: {_label(i.name, _kind(i, None))}: not downloaded (the message "
                "was not addressed to me)]"
                for i in infos
            ]
            return CONTEXT_STATUS, _joined(msg.text, lines)
        lines = [f"[attachment: {_label(i.name, _kind(i, None))}: being downloaded]" for i in infos]
        pending = {
            "type": PENDING_PART,
            "text": msg.text,
            "alone": alone,
            "received": msg.timestamp,
            "attachments": attachments,
        }
        return FETCHING_STATUS, [{"type": "text", "text": _joined(msg.text, lines)}, pending]

    def fetch(self, row: MessageRow, session_key: str, thread_id: str | None, account: str) -> None:
        """Fetch a stored message's attachments in the background, then complete or answer it."""
        waiting = self._waiting(row, session_key, thread_id, account)
        if waiting is None or waiting.message_id in self._active:
            return
        self._active.add(waiting.message_id)
        task = asyncio.create_task(self._finish(waiting), name=f"attachments:{row.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _waiting(
        self, row: MessageRow, session_key: str, thread_id: str | None, account: str
    ) -> _Waiting | None:
        if row.id is None or not row.platform or not row.chat_id:
            log.error("attachments: message %s names no chat; left as it is", row.id)
            return None
        pending = _pending_part(row.content)
        if pending is None:  # nothing to fetch after all: completed with its text, answered
            log.error("attachments: message %s lists no attachments", row.id)
            pending = {"text": _text_of(row.content)}
        attachments = pending.get("attachments")
        received = pending.get("received")
        return _Waiting(
            message_id=row.id,
            session_id=row.session_id,
            session_key=session_key,
            platform=row.platform,
            chat_id=row.chat_id,
            thread_id=thread_id,
            account=account,
            sender_id=row.sender_id or "",
            platform_message_id=row.platform_message_id,
            text=str(pending.get("text") or ""),
            alone=bool(pending.get("alone")),
            received=float(received) if isinstance(received, int | float) else row.created_at.timestamp(),
            attachments=tuple(a for a in attachments or () if isinstance(a, dict)),
        )

    # -- the background part ------------------------------------------------------------------

    async def _finish(self, w: _Waiting) -> None:
        try:
            outcomes = [await self._one(w, i, a) for i, a in enumerate(w.attachments)]
            vision = self.vision
            if w.alone and not any(o.usable(vision) for o in outcomes):
                await self._answer(w, outcomes)
                return
            content = self.content(w.text, outcomes)
            if await self.store.complete_inbound(w.message_id, content):
                try:
                    self._notify(w.session_key)
                except RuntimeError:  # lanes closed: stored, answered when the gateway starts
                    log.info("attachments: %s is answered after the restart", w.session_key)
        except asyncio.CancelledError:
            raise  # still fetching: `resume` finishes it on the next start
        except Exception:
            log.exception("attachments: could not finish message %s; retried on restart",
                          w.message_id)
        finally:
            self._active.discard(w.message_id)

    def content(self, text: str, outcomes: Sequence[Outcome]) -> str | list[dict[str, Any]]:
        """What the model reads: the text, a line per attachment, and (vision) the images."""
        vision = self.vision
        body = _joined(text, [o.note(vision) for o in outcomes])
        images = [p for p in (o.image_part(vision) for o in outcomes) if p is not None]
        if not images:
            return body
        return [{"type": "text", "text": body}, *images]

    async def _answer(self, w: _Waiting, outcomes: Sequence[Outcome]) -> None:
        limit = self.config.attachments.max_bytes
        text = "\n".join(o.plain(self.vision, limit) for o in outcomes) or (
            "Your message arrived without anything I could read."
        )
        reply = Message(role="assistant", content=text)
        reply = reply.with_tokens(self._count_tokens(reply))
        pmid = w.platform_message_id
        outbound = OutboundMessage(
            platform=w.platform,
            chat_id=w.chat_id,
            text=text,
            session_key=w.session_key,
            thread_id=w.thread_id,
            reply_to=pmid,
            account=w.account,
            answers=(pmid,) if pmid else (),
        )
        content = self.content(w.text, outcomes)
        async with self._hold(w.session_key):  # no turn's seqs between the message and reply
            outbox_id = await self.store.answer_inbound(
                w.session_id, w.message_id, content, reply, outbound
            )
        if outbox_id is not None:
            await self._send_stored(outbox_id, outbound)

    async def _one(self, w: _Waiting, index: int, attachment: Mapping[str, Any]) -> Outcome:
        info = describe(attachment)
        label = _label(info.name, _kind(info, None))
        limit = self.config.attachments.max_bytes
        what = f"{w.platform} attachment {label!r} of message {w.platform_message_id}"
        if info.size is not None and info.size > limit:
            log.info("attachments: %s refused: %s bytes is over the limit", what, info.size)
            return self._refused(info, label, info.size)
        channel = self.channels.get(w.platform)
        if not isinstance(channel, FetchesAttachments):
            log.warning("attachments: %s not downloaded: no %s channel here", what, w.platform)
            return Outcome(label, _kind(info, None), size=info.size,
                           problem=f"the {w.platform} channel cannot download files")
        timeout = self.config.attachments.download_timeout
        try:
            async with asyncio.timeout(timeout):
                data = await channel.fetch_attachment(attachment, limit)
        except AttachmentTooLarge as exc:
            log.info("attachments: %s refused: %s", what, exc)
            # Not the platform's size: it was within the limit, so it was wrong (a stream
            # that ran past the limit has no size but "larger than the limit").
            return self._refused(info, label, exc.size)
        except AttachmentUnavailable as exc:
            log.warning("attachments: %s could not be downloaded: %s", what, exc)
            return Outcome(label, _kind(info, None), size=info.size, problem=str(exc))
        except TimeoutError:
            log.warning("attachments: %s could not be downloaded within %g s", what, timeout)
            return Outcome(label, _kind(info, None), size=info.size,
                           problem=f"the download took longer than {timeout:g} s")
        except Exception as exc:  # the network, the SDK: one line, never a traceback
            log.warning("attachments: %s could not be downloaded: %s: %s",
                        what, type(exc).__name__, exc)
            return Outcome(label, _kind(info, None), size=info.size,
                           problem=f"the download failed ({type(exc).__name__})")
        filetype = sniff(data)
        kind = _kind(info, filetype)
        key = info.file_id or f"{w.platform_message_id or 'message'}-{index}"
        if info.file_id is None and w.chat_id != w.sender_id:  # message ids are per chat
            key = f"{w.chat_id}.{key}"
        fallback = kind.replace(" ", "-")
        name = inbox_name(w.platform, w.sender_id, key, info.name, filetype, fallback)
        day = datetime.fromtimestamp(w.received, ZoneInfo(self.config.gateway.timezone))
        # The conversation's own folder: readable from that conversation only (and by owners).
        folder = conversation_folder(w.session_key)
        relative = f"{INBOX_DIR}/{folder}/{day.date().isoformat()}/{name}"
        quota = self.config.attachments.max_total_mb * 1024 * 1024
        try:
            used = await asyncio.to_thread(inbox_bytes, self.config.workspace)
            if used + len(data) > quota:
                log.warning(
                    "attachments: %s not saved: the inbox holds %s of its %s quota "
                    "([attachments] max_total_mb)", what, _size(used), _size(quota),
                )
                return Outcome(label, kind, size=len(data),
                               problem="the inbox is full (its quota is reached)")
            await asyncio.to_thread(_save, self.config.workspace, relative, data)
        except (OSError, WorkspacePathError) as exc:
            log.warning("attachments: %s could not be saved to %s: %s", what, relative, exc)
            return Outcome(label, kind, size=len(data), problem="it could not be saved")
        log.info("attachments: saved %s (%s, %d bytes)", relative, filetype.mime, len(data))
        return Outcome(
            label, kind, relative=relative, filetype=filetype, size=len(data),
            claimed=_claimed_type(info, filetype),
        )

    def _refused(self, info: AttachmentInfo, label: str, size: int | None) -> Outcome:
        limit = _size(self.config.attachments.max_bytes)
        return Outcome(
            label, _kind(info, None), size=size, too_large=True,
            problem=f"larger than the {limit} limit",
        )

    # -- lifecycle ----------------------------------------------------------------------------

    async def resume(self) -> None:
        """Finish the messages a stop or crash left fetching (those of this process's
        channels; a CLI chat without Telegram leaves Telegram's for `gatehouse run`)."""
        try:
            left = await self.store.fetching_messages()
        except Exception:
            log.exception("attachments: could not look for unfinished downloads")
            return
        for row, session in left:
            if row.platform in self.channels and not self._closed:
                log.info("attachments: finishing the downloads of message %s", row.id)
                self.fetch(row, session.key, session.thread_id, session.account)

    async def join(self) -> None:
        """Wait until every fetch started so far is done (tests)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self, grace: float = 10.0) -> None:
        """Let downloads finish for `grace` seconds, then cancel them (they stay fetching and
        are finished on the next start)."""
        self._closed = True
        await finish_or_cancel(list(self._tasks), grace)


def _joined(text: str, lines: Sequence[str]) -> str:
    notes = "\n".join(lines)
    return f"{text.rstrip()}\n{notes}" if text.strip() else notes
