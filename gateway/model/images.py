"""Images in a request: workspace files sent as data URLs to a vision model, left out otherwise.

A stored message names an image it carries by its place in the workspace (an image part whose
URL starts with `WORKSPACE_IMAGE_PREFIX`; gateway/inbound/attachments.py writes them), never by
its bytes: the store, the history cache and the token counts (a fixed cost per image part,
`context.tokens.IMAGE_TOKENS`) stay small. When a request is encoded, `WorkspaceImages` turns
each such part into what the model can take: for ``[llm] vision = true`` a base64 data URL of
the file (read then, confined to the workspace); otherwise nothing -- the message's text already
says what the image was and where it is saved. A file that is gone becomes a line saying so.
"""

from __future__ import annotations

import base64
import logging
from pathlib import Path, PurePosixPath
from typing import Any

from channels.attachments import WORKSPACE_IMAGE_PREFIX
from channels.filetypes import IMAGE_MIME_BY_SUFFIX
from context.types import Message
from memory.workspace import WorkspacePathError, resolve_in_workspace

__all__ = ["WorkspaceImages", "names_workspace_images"]

log = logging.getLogger(__name__)

MAX_IMAGE_BYTES = 20 * 1024 * 1024
"""The largest image sent inline (OpenAI's own limit per image)."""


def _workspace_path(part: Any) -> str | None:
    if not isinstance(part, dict) or part.get("type") != "image_url":
        return None
    inner = part.get("image_url")
    url = inner.get("url") if isinstance(inner, dict) else None
    if isinstance(url, str) and url.startswith(WORKSPACE_IMAGE_PREFIX):
        return url[len(WORKSPACE_IMAGE_PREFIX):]
    return None


def names_workspace_images(message: Message) -> bool:
    """Whether `message` has an image part naming a workspace file."""
    content = message.content
    return isinstance(content, list) and any(_workspace_path(p) is not None for p in content)


class WorkspaceImages:
    """Turns a message's workspace image parts into what the model takes (see the module doc).

    `workspace` None, or `vision` False: the parts are left out."""

    def __init__(self, workspace: Path | None = None, vision: bool = False) -> None:
        self.workspace = workspace
        self.vision = vision and workspace is not None

    def to_openai(self, message: Message) -> dict[str, Any]:
        """`message.to_openai()` with its workspace images inlined or left out; content that is
        only text afterwards is sent as one string (what every server takes)."""
        out = message.to_openai()
        content = message.content
        if not isinstance(content, list):
            return out
        parts: list[dict[str, Any]] = []
        for part in content:
            relative = _workspace_path(part)
            if relative is None:
                parts.append(part)
            elif self.vision:
                parts.append(self._inline(relative, part))
        if all(p.get("type") == "text" for p in parts):
            out["content"] = "\n".join(str(p.get("text", "")) for p in parts)
        else:
            out["content"] = parts
        return out

    def _inline(self, relative: str, part: dict[str, Any]) -> dict[str, Any]:
        assert self.workspace is not None
        mime = IMAGE_MIME_BY_SUFFIX.get(PurePosixPath(relative).suffix.lower())
        try:
            if mime is None:
                raise ValueError("not an image type the model takes")
            path = resolve_in_workspace(self.workspace, relative)
            if path.stat().st_size > MAX_IMAGE_BYTES:
                raise ValueError("larger than a model takes")
            data = path.read_bytes()
        except FileNotFoundError:
            log.warning("image %s not sent to the model: it is no longer in the workspace", relative)
            return {"type": "text", "text": f"[image {relative} is no longer in the workspace]"}
        except (OSError, ValueError, WorkspacePathError) as exc:
            log.warning("image %s not sent to the model: %s", relative, exc)
            return {"type": "text", "text": f"[image {relative} could not be shown: {exc}]"}
        inner = dict(part.get("image_url") or {})
        inner["url"] = f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"
        return {**part, "image_url": inner}
