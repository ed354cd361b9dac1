"""A stand-in for `python -m llama_cpp.server`, for testing the local-model manager.

Takes the same command-line flags the manager passes (`--model`, `--model_alias`, `--host`,
`--port`, `--n_ctx`) and serves an OpenAI-compatible `/v1/models` and `/v1/chat/completions`
(the reply names the model file and echoes the last user message). Extra flags make it
misbehave the ways a real server can: `--exit-with CODE` (dies at start, after logging),
`--never-ready` (listens, but `/v1/models` keeps answering 503), `--startup-delay S`,
`--ignore-sigterm`.

    python -m tests.fakes.fake_llama_server --model m.gguf --port 8080
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from pathlib import Path

from aiohttp import web


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--model_alias", default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--n_ctx", type=int, default=2048)
    parser.add_argument("--exit-with", type=int, default=None)
    parser.add_argument("--never-ready", action="store_true")
    parser.add_argument("--startup-delay", type=float, default=0.0)
    parser.add_argument("--ignore-sigterm", action="store_true")
    return parser.parse_args(argv)


def build(args: argparse.Namespace) -> web.Application:
    alias = args.model_alias or args.model
    model_name = Path(args.model).name

    async def models(_request: web.Request) -> web.Response:
        if args.never_ready:
            return web.json_response({"error": "loading model"}, status=503)
        return web.json_response(
            {"object": "list", "data": [{"id": alias, "object": "model", "owned_by": "me"}]}
        )

    async def chat(request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        last = next(
            (m["content"] for m in reversed(body["messages"]) if m["role"] == "user"), ""
        )
        text = (
            f"[{model_name} n_ctx={args.n_ctx} max_tokens={body.get('max_tokens')}] "
            f"you said: {last}"
        )
        usage = {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19}
        if body.get("stream"):
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            chunk = {
                "id": "c1", "object": "chat.completion.chunk", "created": int(time.time()),
                "model": alias,
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": text},
                             "finish_reason": "stop"}],
            }
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await response.write(b"data: [DONE]\n\n")
            return response
        return web.json_response({
            "id": "c1", "object": "chat.completion", "created": int(time.time()), "model": alias,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "stop"}],
            "usage": usage,
        })

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def main(argv: list[str]) -> int:
    args = parse(argv)
    print(f"fake llama server: loading {args.model}", flush=True)
    if args.exit_with is not None:
        print("error: failed to load model (this fake was told to fail)", file=sys.stderr,
              flush=True)
        return args.exit_with
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    await asyncio.sleep(args.startup_delay)
    runner = web.AppRunner(build(args))
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port).start()
    print(f"listening on http://{args.host}:{args.port}", flush=True)
    stop = asyncio.Event()
    if not args.ignore_sigterm:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await runner.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
