"""Another gatehouse process holding the shared bundled-model server: starts a
`LocalModelServer` on the fake llama server with a state file, prints ``ready <base_url>
<reused>``, and stops it on SIGTERM (a kill -9 leaves its server and record behind, as a
crashed `gatehouse run` would).

    python -m tests.helpers.local_model_owner --model m.gguf --state data/local-model.json
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from gateway.model.local_model import LocalModelServer

FAKE_SERVER = "tests.fakes.fake_llama_server"


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--state", required=True, type=Path)
    args = parser.parse_args(argv)
    server = LocalModelServer(
        args.model, args.state.parent / "local-model.log", server_module=FAKE_SERVER,
        state_path=args.state, watch_interval=0.1,
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    url = await server.start()
    print(f"ready {url} {server.reused}", flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop(grace=2)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
