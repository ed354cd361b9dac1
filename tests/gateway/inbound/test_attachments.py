"""Inbox names and what the agent and the person are told about each attachment."""

from __future__ import annotations

import pytest

from channels.filetypes import FileType, sniff
from gateway.inbound.attachments import Outcome, inbox_name

JPEG = sniff(b"\xff\xd8\xff\xe0")
HTML = sniff(b"<html><body>")
TEXT = sniff(b"hello\n")
EXE = sniff(b"\x7fELF\x02")


@pytest.mark.parametrize(
    ("sender", "key", "name", "filetype", "expected"),
    [
        ("7", "42-0", None, JPEG, "telegram-7-42-0-photo.jpg"),
        ("7", "42-0", "holiday.JPG", JPEG, "telegram-7-42-0-holiday.jpg"),
        ("7", "42-0", "../../etc/passwd", TEXT, "telegram-7-42-0-passwd.txt"),
        ("7", "42-0", "..\\..\\boot.ini", TEXT, "telegram-7-42-0-boot.ini"),
        ("7", "42-0", ".bashrc", TEXT, "telegram-7-42-0-bashrc.txt"),
        ("7", "42-0", "cat.jpg", HTML, "telegram-7-42-0-cat.jpg.html"),
        ("7", "42-0", "setup.exe", EXE, "telegram-7-42-0-setup.exe.bin"),
        ("7", "42-0", "отчёт за май.txt", TEXT, "telegram-7-42-0-отчёт_за_май.txt"),
        ("../../x", "a/b:c", "x.txt", TEXT, "telegram-x-a_b_c-x.txt"),
        ("7", "42-0", "\u202eexe.txt", TEXT, "telegram-7-42-0-exe.txt"),  # bidi override gone
        ("", "", "...", TEXT, "telegram-x-x-file.txt"),
    ],
)
def test_inbox_names_are_one_safe_component(
    sender: str, key: str, name: str | None, filetype: FileType, expected: str
) -> None:
    got = inbox_name("telegram", sender, key, name, filetype, "photo" if name is None else "file")
    assert got == expected
    assert "/" not in got and "\\" not in got and not got.startswith(".")


def test_a_long_name_fits_a_file_system_name_and_keeps_its_extension() -> None:
    got = inbox_name("slack", "U1", "F1", "é" * 300 + ".pdf", sniff(b"%PDF-1.7"), "file")
    assert got.endswith(".pdf")
    assert len(got.encode()) <= 200


def test_notes_and_plain_answers() -> None:
    photo = Outcome("photo", "photo", relative="inbox/d/p.jpg", filetype=JPEG, size=120 * 1024)
    assert photo.note(vision=True) == (
        "[attachment: photo, image/jpeg, 120 KB, saved to inbox/d/p.jpg]"
    )
    assert photo.note(vision=False) == (
        "[attachment: photo, image/jpeg, 120 KB, saved to inbox/d/p.jpg; this model cannot "
        "see images]"
    )
    assert photo.usable(vision=True) and not photo.usable(vision=False)
    assert photo.plain(False, 100) == (
        "I received your photo (saved to inbox/d/p.jpg) but this model cannot see images."
    )
    refused = Outcome("big.zip", "file", size=30 * 1024 * 1024, too_large=True,
                      problem="larger than the 20.0 MB limit")
    assert refused.note(True) == (
        "[attachment: big.zip, 30.0 MB: not saved, larger than the 20.0 MB limit]"
    )
    assert refused.plain(True, 20 * 1024 * 1024) == (
        "I could not take big.zip: it is 30.0 MB, and files may be at most 20.0 MB."
    )
    heic = Outcome("x.heic", "image", relative="inbox/d/x.heic",
                   filetype=sniff(b"\x00\x00\x00\x18ftypheic"), size=10)
    assert not heic.usable(vision=True)
    assert heic.plain(True, 100).endswith("but I cannot see image/heic images; JPEG or PNG works.")
    doc = Outcome("a.txt", "file", relative="inbox/d/a.txt", filetype=TEXT, size=6)
    assert doc.usable(vision=False)  # the agent can read it (memory_get): it answers itself
