"""Benchmark: CPU instructions per message, Gatehouse against the bare bot making the same model
call, counted by valgrind (cachegrind) instead of timed.

`bench/channels.py` times each path, and on a shared 2-core VM the same code runs up to 2x
slower from one hour to the next, so its ratios swing run to run. An instruction count does not:
it is the same for the same code and inputs whatever else the machine is doing. Each path runs
twice under cachegrind (``--small`` and ``--large`` messages, 20 at a time, the same fakes as
`bench/channels.py`); the difference divided by the extra messages is the cost of one message,
with start-up and warm-up cancelled out. Only the benchmark process is counted: the fake model
server runs in a child process that valgrind does not follow, for both paths alike. Gatehouse's
typing indicator is held back (each turn is ~50x slower under valgrind, and would outlast the
500 ms delay that native turns finish within).

``--cache`` also simulates the caches and branch predictor (first-level cache misses, misses in a
per-core L2 the size of this machine's, and mispredicted branches per message): instructions do
not cost the same, and those are what make one instruction dearer than another. An L2 miss costs
tens of cycles, so they are what separates two paths with the same instruction count. It is
about 2.5x slower.

    .venv/bin/python bench/instructions.py [--only discord] [--small 200] [--large 600] [--cache]
                                           [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONCURRENCY = 20
PATHS = {  # platform: (module, bare bot function, gatehouse function)
    "telegram": ("bench.channel_telegram", "_bare", "_gatehouse"),
    "slack": ("bench.channel_slack", "_bare", "_gatehouse"),
    "discord": ("bench.channel_discord", "measure_bare", "measure_gatehouse"),
}
BARE = "bare bot + 1 model call"
GATEHOUSE = "gatehouse"
_COUNTERS = {
    "instructions": r"I\s+refs:\s+([\d,]+)",
    "i1_misses": r"I1\s+misses:\s+([\d,]+)",
    "d1_misses": r"D1\s+misses:\s+([\d,]+)",
    "mispredicts": r"Mispredicts:\s+([\d,]+)",
    "lli_misses": r"LLi\s+misses:\s+([\d,]+)",
    "lld_misses": r"LLd\s+misses:\s+([\d,]+)",
}
L2_SIZE_FILE = Path("/sys/devices/system/cpu/cpu0/cache/index2/size")


def l2_bytes() -> int:
    """This machine's per-core L2 (what cachegrind simulates as its last level), else 2 MiB."""
    try:
        text = L2_SIZE_FILE.read_text().strip().upper()
    except OSError:
        return 2 * 1024 * 1024
    scale = {"K": 1024, "M": 1024 * 1024}.get(text[-1:], 1)
    digits = text.rstrip("KM")
    return int(digits) * scale if digits.isdigit() else 2 * 1024 * 1024

# What runs under valgrind: one path, `messages` messages, 20 at a time.
_CHILD = """
import asyncio, importlib, logging, sys
sys.path.insert(0, {root!r})
logging.basicConfig(level=logging.ERROR)
from bench.common import GATEWAY_OVERRIDES, fake_llm_process
module = importlib.import_module({module!r})
# Valgrind runs every turn ~50x slower, past the 500 ms typing delay: Gatehouse would then send a
# "typing" request per message that no native run sends, and count it.
GATEWAY_OVERRIDES["typing_delay_ms"] = 3_600_000

async def main():
    if {gatehouse!r}:
        await getattr(module, {gatehouse_fn!r})({messages}, {concurrency})
    else:
        async with fake_llm_process() as url:
            await getattr(module, {bare_fn!r})({messages}, {concurrency}, url)

asyncio.run(main())
"""


def count(platform: str, gatehouse: bool, messages: int, cache: bool) -> dict[str, int]:
    """Run one path under cachegrind; its counters for the whole process."""
    module, bare_fn, gatehouse_fn = PATHS[platform]
    code = _CHILD.format(
        root=str(ROOT), module=module, gatehouse=gatehouse, gatehouse_fn=gatehouse_fn,
        bare_fn=bare_fn, messages=messages, concurrency=CONCURRENCY,
    )
    sim = (
        ["--cache-sim=yes", "--branch-sim=yes", f"--LL={l2_bytes()},16,64"]
        if cache
        else ["--cache-sim=no"]
    )
    done = subprocess.run(
        ["valgrind", "--tool=cachegrind", *sim, "--cachegrind-out-file=/dev/null",
         sys.executable, "-c", code],
        capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"}, check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{platform} {'gatehouse' if gatehouse else 'bare'} failed:\n"
                           f"{done.stderr[-3000:]}")
    return read_counters(done.stderr)


def read_counters(summary: str) -> dict[str, int]:
    """The counters in cachegrind's summary; L2 misses are its last-level (LLi + LLd) ones."""
    found: dict[str, int] = {}
    for name, pattern in _COUNTERS.items():
        match = re.search(pattern, summary)
        if match:
            found[name] = int(match.group(1).replace(",", ""))
    if "lli_misses" in found and "lld_misses" in found:
        found["l2_misses"] = found.pop("lli_misses") + found.pop("lld_misses")
    return found


def per_message(small: dict[str, int], large: dict[str, int], extra: int) -> dict[str, float]:
    """What one more message costs: the two runs' difference over the extra messages."""
    return {name: (large[name] - small[name]) / extra for name in large if name in small}


def measure(platform: str, small: int, large: int, cache: bool) -> list[dict[str, Any]]:
    """Both paths of one platform, at both sizes (two runs at a time: one per core)."""
    jobs = [(gh, n) for gh in (False, True) for n in (small, large)]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda job: count(platform, job[0], job[1], cache), jobs))
    bare = per_message(results[0], results[1], large - small)
    gatehouse = per_message(results[2], results[3], large - small)
    return [
        {"platform": platform, "path": BARE, **bare},
        {"platform": platform, "path": GATEHOUSE, **gatehouse,
         "ratios": {k: gatehouse[k] / bare[k] for k in gatehouse if bare.get(k)}},
    ]


def table(rows: list[dict[str, Any]], cache: bool) -> Table:
    names = [
        "instructions", *(["i1_misses", "d1_misses", "l2_misses", "mispredicts"] if cache else [])
    ]
    out = Table(title=f"per message, {CONCURRENCY} at a time, counted by valgrind (no clock)")
    out.add_column("platform")
    out.add_column("path")
    for name in names:
        out.add_column(name.replace("_", " "), justify="right")
        out.add_column("vs bare", justify="right")
    for row in rows:
        cells = [row["platform"], row["path"]]
        for name in names:
            cells.append(f"{row.get(name, 0):,.0f}")
            ratio = row.get("ratios", {}).get(name)
            cells.append(f"×{ratio:.2f}" if ratio else "")
        out.add_row(*cells)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(PATHS), action="append")
    parser.add_argument("--small", type=int, default=200)
    parser.add_argument("--large", type=int, default=600)
    parser.add_argument("--cache", action="store_true", help="simulate caches and branches")
    parser.add_argument("--quick", action="store_true", help="100 and 300 messages")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.quick:
        args.small, args.large = 100, 300
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    if args.large <= args.small:
        raise SystemExit("--large must be more messages than --small")
    rows: list[dict[str, Any]] = []
    for platform in args.only or ["discord"]:
        rows += measure(platform, args.small, args.large, args.cache)
    Console(width=170).print(table(rows, args.cache))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
