"""Content sniffing: a file's type comes from its bytes, and a name must not promise otherwise."""

from __future__ import annotations

import io
import zipfile

import pytest

from channels.filetypes import extension_fits, sniff


def _zip(*names: str) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name in names:
            archive.writestr(name, "x")
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("data", "mime", "kind"),
    [
        (b"\xff\xd8\xff\xe0\x00\x10JFIF", "image/jpeg", "image"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "image/png", "image"),
        (b"GIF89a\x01\x00", "image/gif", "image"),
        (b"RIFF\x00\x00\x00\x00WEBPVP8 ", "image/webp", "image"),
        (b"\x00\x00\x00\x18ftypheic\x00\x00", "image/heic", "image"),
        (b"%PDF-1.7\n", "application/pdf", "document"),
        (b"OggS\x00\x02", "audio/ogg", "audio"),
        (b"ID3\x04\x00", "audio/mpeg", "audio"),
        (b"RIFF\x00\x00\x00\x00WAVEfmt ", "audio/wav", "audio"),
        (b"\x00\x00\x00\x18ftypM4A \x00\x00", "audio/mp4", "audio"),
        (b"\x00\x00\x00\x18ftypisom\x00\x00", "video/mp4", "video"),
        (b"\x1aE\xdf\xa3\x9fB\x86\x81\x01webm", "video/webm", "video"),
        (b"\x7fELF\x02\x01\x01", "application/x-executable", "executable"),
        (b"MZ" + b"\x00" * 58 + b"\x40\x00\x00\x00" + b"PE\x00\x00", "application/vnd.microsoft.portable-executable", "executable"),
        (b"\xcf\xfa\xed\xfe\x07\x00", "application/x-mach-binary", "executable"),
        (b"  <!DOCTYPE html><html><body>hi</body></html>", "text/html", "html"),
        (b"<?xml version='1.0'?><svg xmlns='http://www.w3.org/2000/svg'/>", "image/svg+xml", "html"),
        (b"#!/bin/sh\nrm -rf /\n", "text/x-script", "text"),
        (b'{"a": [1, 2]}', "application/json", "text"),
        ("plain text, ünïcödé ✓\n".encode(), "text/plain", "text"),
        (b"", "application/x-empty", "text"),
        (b"\x00\x01\x02\x03\xfe\xff" * 10, "application/octet-stream", "binary"),
        (_zip("[Content_Types].xml", "word/document.xml"),
         "application/vnd.openxmlformats-officedocument.wordprocessingml.document", "document"),
        (_zip("META-INF/MANIFEST.MF", "a/B.class"), "application/java-archive", "executable"),
        (_zip("readme.txt"), "application/zip", "archive"),
    ],
)
def test_sniffed_by_content(data: bytes, mime: str, kind: str) -> None:
    found = sniff(data)
    assert (found.mime, found.kind) == (mime, kind)


def test_a_multibyte_character_cut_by_the_sample_is_still_text() -> None:
    data = ("é" * 40_000).encode()  # 80,000 bytes: the 64 KB sample ends inside a character
    assert sniff(data).mime == "text/plain"


@pytest.mark.parametrize(
    ("extension", "data", "fits"),
    [
        (".jpg", b"\xff\xd8\xff\xe0", True),
        (".jpeg", b"\xff\xd8\xff\xe0", True),
        (".jpg", b"<html><body>", False),  # disguised: HTML named as an image
        (".png", b"\xff\xd8\xff\xe0", False),  # a JPEG named .png is renamed, not trusted
        (".exe", b"MZ" + b"\x00" * 58 + b"\x40\x00\x00\x00" + b"PE\x00\x00", False),
        (".csv", b"a,b\n1,2\n", True),  # text keeps any harmless extension
        (".md", b"# notes\n", True),
        (".html", b"no tags here", False),  # text may not claim to be a web page
        (".jpg", b"just text", False),  # nor an image
        (".sh", b"#!/bin/sh\necho hi\n", True),  # a script named as one is honest
        (".psd", b"8BPS\x00\x01\x00\x00\x00\x00", True),  # unknown binary keeps its own
        ("", b"text", False),
    ],
)
def test_extension_fits(extension: str, data: bytes, fits: bool) -> None:
    assert extension_fits(extension, sniff(data)) is fits
