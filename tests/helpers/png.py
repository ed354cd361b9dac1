"""Read a browser screenshot (PNG) into pixels, to check it programmatically: zlib + numpy.

Chromium writes 8-bit RGB or RGBA, non-interlaced PNGs; that is all this reads.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

SIGNATURE = b"\x89PNG\r\n\x1a\n"


def read_png(path: Path) -> NDArray[np.uint8]:
    """The image as a (height, width, 3) RGB array."""
    data = path.read_bytes()
    if not data.startswith(SIGNATURE):
        raise ValueError(f"{path} is not a PNG")
    pos, idat = len(SIGNATURE), b""
    width = height = channels = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        chunk = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, color, _c, _f, interlace = struct.unpack(">IIBBBBB", chunk)
            if depth != 8 or color not in (2, 6) or interlace:
                raise ValueError(f"{path}: unsupported PNG (depth {depth}, color type {color})")
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += chunk
        elif kind == b"IEND":
            break
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8)
    stride = width * channels
    rows = raw.reshape(height, stride + 1)
    out = np.zeros((height, stride), dtype=np.int32)
    prev = np.zeros(stride, dtype=np.int32)
    for y in range(height):
        kind, line = rows[y, 0], rows[y, 1:].astype(np.int32)
        if kind == 0:
            cur = line
        elif kind == 1:
            cur = _sub(line, channels)
        elif kind == 2:
            cur = (line + prev) & 0xFF
        elif kind == 3:
            cur = _average(line, prev, channels)
        elif kind == 4:
            cur = _paeth(line, prev, channels)
        else:
            raise ValueError(f"{path}: unknown PNG filter {kind}")
        out[y] = cur
        prev = cur
    pixels = out.reshape(height, width, channels).astype(np.uint8)
    return pixels[:, :, :3]


def _sub(line: NDArray[np.int32], bpp: int) -> NDArray[np.int32]:
    cur = line.copy()
    for x in range(bpp, len(cur)):
        cur[x] = (cur[x] + cur[x - bpp]) & 0xFF
    return cur


def _average(line: NDArray[np.int32], prev: NDArray[np.int32], bpp: int) -> NDArray[np.int32]:
    cur = line.copy()
    for x in range(len(cur)):
        left = cur[x - bpp] if x >= bpp else 0
        cur[x] = (cur[x] + ((left + prev[x]) >> 1)) & 0xFF
    return cur


def _paeth(line: NDArray[np.int32], prev: NDArray[np.int32], bpp: int) -> NDArray[np.int32]:
    cur = line.copy()
    for x in range(len(cur)):
        a = int(cur[x - bpp]) if x >= bpp else 0
        b = int(prev[x])
        c = int(prev[x - bpp]) if x >= bpp else 0
        p = a + b - c
        pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
        pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
        cur[x] = (int(cur[x]) + pred) & 0xFF
    return cur


def share_of(pixels: NDArray[np.uint8], rgb: tuple[int, int, int], tolerance: int = 12) -> float:
    """The share of pixels within `tolerance` of colour `rgb` (each channel)."""
    diff = np.abs(pixels.astype(np.int16) - np.array(rgb, dtype=np.int16))
    return float(np.all(diff <= tolerance, axis=2).mean())


def distinct_colours(pixels: NDArray[np.uint8]) -> int:
    flat = pixels.reshape(-1, 3).astype(np.uint32)
    return int(np.unique((flat[:, 0] << 16) | (flat[:, 1] << 8) | flat[:, 2]).size)


def widest_run(pixels: NDArray[np.uint8], rgb: tuple[int, int, int], tolerance: int = 12) -> int:
    """The longest horizontal run of colour `rgb` in any row: a filled box (a bubble, a code
    block) makes a long one, text in that colour only short ones."""
    diff = np.abs(pixels.astype(np.int16) - np.array(rgb, dtype=np.int16))
    match = np.all(diff <= tolerance, axis=2)
    best = 0
    for row in match:
        if not row.any():
            continue
        padded = np.concatenate(([0], row.astype(np.int8), [0]))
        edges = np.flatnonzero(np.diff(padded))
        best = max(best, int((edges[1::2] - edges[::2]).max()))
    return best
