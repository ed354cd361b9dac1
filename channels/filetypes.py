"""What a file is, from its first bytes (magic numbers), never from its name alone.

A name (``cat.jpg``) and a claimed type (``image/jpeg``) are what the sender's client says; the
bytes are what the file is. `sniff` reads the bytes; `extension_fits` says whether the name's
extension is an honest one for that content, so a disguised file is saved under a name that
says what it is (``cat.jpg.html``) and an executable never keeps a name that would run it.
"""

from __future__ import annotations

import codecs
import io
import json
import zipfile
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "IMAGE_MIME_BY_SUFFIX",
    "VISION_TYPES",
    "FileType",
    "extension_fits",
    "sniff",
]

Kind = Literal[
    "image", "audio", "video", "document", "archive", "text", "html", "executable", "binary"
]


@dataclass(frozen=True, slots=True)
class FileType:
    mime: str
    kind: Kind
    extensions: tuple[str, ...]
    """Honest extensions for this content, the first the one the gateway gives it; empty:
    none is (an executable is saved as ``.bin``)."""

    @property
    def extension(self) -> str:
        return self.extensions[0] if self.extensions else ".bin"


VISION_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
"""Image types OpenAI-compatible vision models take as image parts."""
IMAGE_MIME_BY_SUFFIX = {".jpg": "image/jpeg", ".png": "image/png", ".gif": "image/gif",
                        ".webp": "image/webp"}
"""A saved image's type by the extension `FileType.extension` gave it."""

JPEG = FileType("image/jpeg", "image", (".jpg", ".jpeg", ".jpe", ".jfif"))
PNG = FileType("image/png", "image", (".png",))
GIF = FileType("image/gif", "image", (".gif",))
WEBP = FileType("image/webp", "image", (".webp",))
HEIC = FileType("image/heic", "image", (".heic", ".heif"))
SVG = FileType("image/svg+xml", "html", (".svg",))  # may carry scripts: active content
PDF = FileType("application/pdf", "document", (".pdf",))
ZIP = FileType("application/zip", "archive", (".zip",))
GZIP = FileType("application/gzip", "archive", (".gz", ".tgz"))
SEVEN_Z = FileType("application/x-7z-compressed", "archive", (".7z",))
RAR = FileType("application/vnd.rar", "archive", (".rar",))
OLE = FileType("application/x-ole-storage", "document", (".doc", ".xls", ".ppt", ".msg"))
OGG = FileType("audio/ogg", "audio", (".ogg", ".oga", ".opus"))
MP3 = FileType("audio/mpeg", "audio", (".mp3",))
WAV = FileType("audio/wav", "audio", (".wav",))
FLAC = FileType("audio/flac", "audio", (".flac",))
M4A = FileType("audio/mp4", "audio", (".m4a",))
MP4 = FileType("video/mp4", "video", (".mp4", ".m4v"))
MOV = FileType("video/quicktime", "video", (".mov",))
WEBM = FileType("video/webm", "video", (".webm",))
MKV = FileType("video/x-matroska", "video", (".mkv",))
HTML = FileType("text/html", "html", (".html", ".htm"))
XML = FileType("application/xml", "text", (".xml",))
JSON = FileType("application/json", "text", (".json",))
SCRIPT = FileType("text/x-script", "text", (".txt", ".sh", ".py", ".pl", ".rb"))
TEXT = FileType("text/plain", "text", (".txt",))
EMPTY = FileType("application/x-empty", "text", (".txt",))
ELF = FileType("application/x-executable", "executable", ())
WINDOWS_EXE = FileType("application/vnd.microsoft.portable-executable", "executable", ())
MACH_O = FileType("application/x-mach-binary", "executable", ())
JAR = FileType("application/java-archive", "executable", ())
BINARY = FileType("application/octet-stream", "binary", (".bin",))

_OOXML = {
    "word/": FileType(
        "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        "document", (".docx",),
    ),
    "xl/": FileType(
        "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        "document", (".xlsx",),
    ),
    "ppt/": FileType(
        "application/vnd.openxmlformats-officedocument.presentationml.presentation",
        "document", (".pptx",),
    ),
}
_ODF = {
    "application/vnd.oasis.opendocument.text": (".odt",),
    "application/vnd.oasis.opendocument.spreadsheet": (".ods",),
    "application/vnd.oasis.opendocument.presentation": (".odp",),
    "application/epub+zip": (".epub",),
}

RISKY_EXTENSIONS = frozenset(
    {".exe", ".com", ".bat", ".cmd", ".scr", ".msi", ".dll", ".so", ".dylib", ".app", ".jar",
     ".js", ".mjs", ".vbs", ".ps1", ".psm1", ".sh", ".bash", ".zsh", ".py", ".pl", ".rb",
     ".html", ".htm", ".xhtml", ".svg", ".hta", ".lnk", ".desktop", ".apk", ".elf", ".php"}
)
"""Extensions that open or run as code somewhere: only content sniffed as such may keep them."""

_HTML_MARKERS = (b"<!doctype html", b"<html", b"<head", b"<body", b"<script", b"<iframe")
_TEXT_SAMPLE = 64 * 1024


def _zip_type(data: bytes) -> FileType:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = archive.namelist()
            if "mimetype" in names:
                declared = archive.read("mimetype")[:100].decode("ascii", "replace").strip()
                if declared in _ODF:
                    return FileType(declared, "document", _ODF[declared])
    except (zipfile.BadZipFile, OSError, ValueError, KeyError, NotImplementedError,
            RuntimeError, EOFError):
        return ZIP  # a zip's start, cut or damaged: still a zip
    if "[Content_Types].xml" in names:
        for prefix, filetype in _OOXML.items():
            if any(name.startswith(prefix) for name in names):
                return filetype
    if "META-INF/MANIFEST.MF" in names and any(name.endswith(".class") for name in names):
        return JAR
    return ZIP


def _iso_media(data: bytes) -> FileType:
    brand = data[8:12]
    if brand in (b"heic", b"heix", b"mif1", b"msf1", b"heim", b"heis"):
        return HEIC
    if brand in (b"M4A ", b"M4B ", b"M4P "):
        return M4A
    if brand == b"qt  ":
        return MOV
    return MP4


def _windows_exe(data: bytes) -> bool:
    if len(data) < 64:
        return False
    offset = int.from_bytes(data[0x3C:0x40], "little")
    return data[offset : offset + 4] == b"PE\0\0" or b"cannot be run in DOS mode" in data[:512]


def _text_type(data: bytes) -> FileType | None:
    sample = data[:_TEXT_SAMPLE]
    if b"\x00" in sample:
        return None
    try:  # incremental: a multi-byte character cut by the sample is not an error
        text = codecs.getincrementaldecoder("utf-8-sig")().decode(sample, final=len(data) <= len(sample))
    except UnicodeDecodeError:
        return None
    controls = sum(1 for c in text if ord(c) < 32 and c not in "\t\n\r\f\v\x1b")
    if controls > max(2, len(text) // 100):
        return None
    head = text.lstrip()[:1024].lower().encode()
    if any(marker in head for marker in _HTML_MARKERS):
        return HTML
    if head.startswith(b"<?xml") or head.startswith(b"<svg"):
        return SVG if b"<svg" in text[:4096].lower().encode() else XML
    if text.startswith("#!"):
        return SCRIPT
    if head[:1] in (b"{", b"[") and len(data) <= len(sample):
        try:
            json.loads(text)
        except ValueError:
            return TEXT
        return JSON
    return TEXT


def sniff(data: bytes) -> FileType:
    """The type of `data` by its content (magic numbers, then text checks)."""
    if not data:
        return EMPTY
    head = data[:16]
    if head.startswith(b"\xff\xd8\xff"):
        return JPEG
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return PNG
    if head.startswith((b"GIF87a", b"GIF89a")):
        return GIF
    if head.startswith(b"RIFF") and data[8:12] == b"WEBP":
        return WEBP
    if head.startswith(b"RIFF") and data[8:12] == b"WAVE":
        return WAV
    if head.startswith(b"%PDF-"):
        return PDF
    if head.startswith(b"PK\x03\x04"):
        return _zip_type(data)
    if head.startswith(b"\x1f\x8b"):
        return GZIP
    if head.startswith(b"7z\xbc\xaf\x27\x1c"):
        return SEVEN_Z
    if head.startswith(b"Rar!\x1a\x07"):
        return RAR
    if head.startswith(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"):
        return OLE
    if head.startswith(b"OggS"):
        return OGG
    if head.startswith(b"fLaC"):
        return FLAC
    if head.startswith(b"ID3") or (len(head) > 1 and head[0] == 0xFF and head[1] in (0xFB, 0xF3, 0xF2)):
        return MP3
    if data[4:8] == b"ftyp":
        return _iso_media(data)
    if head.startswith(b"\x1a\x45\xdf\xa3"):
        return WEBM if b"webm" in data[:64] else MKV
    if head.startswith(b"\x7fELF"):
        return ELF
    if head.startswith(b"MZ") and _windows_exe(data):
        return WINDOWS_EXE
    if head[:4] in (b"\xfe\xed\xfa\xce", b"\xfe\xed\xfa\xcf", b"\xce\xfa\xed\xfe", b"\xcf\xfa\xed\xfe"):
        return MACH_O
    return _text_type(data) or BINARY


_KNOWN = (
    JPEG, PNG, GIF, WEBP, HEIC, SVG, PDF, ZIP, GZIP, SEVEN_Z, RAR, OLE, OGG, MP3, WAV, FLAC, M4A,
    MP4, MOV, WEBM, MKV, HTML, *_OOXML.values(),
)
CLAIMED_EXTENSIONS = frozenset(
    [ext for known in _KNOWN for ext in known.extensions]
    + [ext for exts in _ODF.values() for ext in exts]
)
"""Extensions of types `sniff` recognises: a file named so but not sniffed so is disguised."""


def extension_fits(extension: str, filetype: FileType) -> bool:
    """Whether a name ending in `extension` (".jpg", lower case) honestly names `filetype`:
    one of its own extensions, or, for text and unknown binary data, any extension that neither
    promises something that opens or runs as code nor names a type the bytes are not."""
    if extension in filetype.extensions:
        return True
    if filetype in (TEXT, BINARY, EMPTY, JSON, XML):
        return (
            bool(extension)
            and extension not in RISKY_EXTENSIONS
            and extension not in CLAIMED_EXTENSIONS
        )
    return False
