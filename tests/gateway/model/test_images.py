"""Workspace images in a request: inlined for a vision model, left out for any other, never
cached, never read from outside the workspace; counted at a fixed cost per image."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from context.tokens import IMAGE_TOKENS, estimate_counter
from context.types import Message
from gateway.model.images import WorkspaceImages
from gateway.model.llm import RequestEncoder

JPEG = b"\xff\xd8\xff\xe0" + b"\x07" * 100


def photo_message(relative: str, seq: int | None = 3) -> Message:
    return Message(
        role="user",
        content=[
            {"type": "text", "text": f"look\n[attachment: photo, saved to {relative}]"},
            {"type": "image_url", "image_url": {"url": f"workspace:{relative}"}},
        ],
        seq=seq,
    )


def sent(encoder: RequestEncoder, *messages: Message) -> list[dict[str, Any]]:
    body = json.loads(encoder.encode({"model": "m"}, messages))
    return list(body["messages"])


def test_a_vision_model_gets_the_file_as_a_data_url(tmp_path: Path) -> None:
    (tmp_path / "inbox").mkdir()
    (tmp_path / "inbox" / "p.jpg").write_bytes(JPEG)
    encoder = RequestEncoder()
    encoder.images = WorkspaceImages(tmp_path, vision=True)
    [message] = sent(encoder, photo_message("inbox/p.jpg"))
    text, image = message["content"]
    assert text["type"] == "text"
    url = image["image_url"]["url"]
    assert url.startswith("data:image/jpeg;base64,")
    assert base64.b64decode(url.split(",", 1)[1]) == JPEG
    assert encoder._messages == {}  # megabytes are never kept between calls


def test_without_vision_the_image_is_left_out_and_the_text_sent_plain(tmp_path: Path) -> None:
    (tmp_path / "inbox").mkdir()
    (tmp_path / "inbox" / "p.jpg").write_bytes(JPEG)
    for images in (WorkspaceImages(tmp_path, vision=False), WorkspaceImages()):
        encoder = RequestEncoder()
        encoder.images = images
        [message] = sent(encoder, photo_message("inbox/p.jpg"))
        assert message["content"] == "look\n[attachment: photo, saved to inbox/p.jpg]"


def test_a_missing_or_escaping_file_becomes_a_line(tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (tmp_path / "secret.jpg").write_bytes(JPEG)
    encoder = RequestEncoder()
    encoder.images = WorkspaceImages(workspace, vision=True)
    gone, escaping = sent(
        encoder, photo_message("inbox/gone.jpg"), photo_message("../secret.jpg", seq=4)
    )
    assert gone["content"] == (  # only text left: sent as one string
        "look\n[attachment: photo, saved to inbox/gone.jpg]\n"
        "[image inbox/gone.jpg is no longer in the workspace]"
    )
    assert "could not be shown" in escaping["content"]
    assert "data:" not in json.dumps(escaping)


def test_an_image_part_costs_a_fixed_count_whatever_its_size() -> None:
    counter = estimate_counter()
    small = photo_message("inbox/a.jpg")
    text_only = Message(role="user", content=small.text)
    assert counter.count_message(small) == counter.count_message(text_only) + IMAGE_TOKENS
