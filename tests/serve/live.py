"""Processes on loopback for the live tests: `pagedkv serve --tiny` engines and the router."""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

SRC = str(Path(__file__).resolve().parents[2] / "src")
START_TIMEOUT_S = 600.0  # a loaded 2-core machine takes minutes to import torch thrice

# One client for every call (it is thread-safe): a new one per request builds an SSL
# context each time, which cost the live router test seconds of CPU per hundred chats.
HTTP = httpx.Client(trust_env=False)
atexit.register(HTTP.close)


def free_ports(count: int) -> list[int]:
    """Ports the OS had free on 127.0.0.1 (held open together, so all distinct)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def wait_until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{what} within {timeout_s} s")


def _spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env["OMP_NUM_THREADS"] = "1"
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "pagedkv", *args], stdout=out, stderr=subprocess.STDOUT, env=env
        )


@dataclass
class Engine:
    name: str
    http_port: int
    pub_port: int
    replay_port: int
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start(self) -> None:
        self.proc = _spawn(
            [
                "serve", "Qwen3-8B", "--tiny", "--port", str(self.http_port),
                "--kv-events-endpoint", f"tcp://127.0.0.1:{self.pub_port}",
                "--kv-events-replay-endpoint", f"tcp://127.0.0.1:{self.replay_port}",
                "--kv-cache-memory-bytes", "16MiB", "--max-num-seqs", "16",
            ],
            self.log,
        )  # fmt: skip

    def ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited: {self.log.read_text()[-2000:]}")
        return HTTP.get(f"{self.url}/health", timeout=1).status_code == 200

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
        self.proc = None


@dataclass
class Router:
    port: int
    engines: list[Engine]
    log: Path
    router: str = "balanced"
    proc: subprocess.Popen[bytes] | None = None
    extra: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        es = self.engines
        self.proc = _spawn(
            [
                "route", "serve", "--listen", f"127.0.0.1:{self.port}", "--router", self.router,
                "--engines", ",".join(f"{e.name}=tcp://127.0.0.1:{e.pub_port}" for e in es),
                "--replay-endpoints", ",".join(f"tcp://127.0.0.1:{e.replay_port}" for e in es),
                "--engine-urls", ",".join(e.url for e in es),
                "--tiny-tokenizer", "--scrape-interval", "0.2", "--request-timeout", "60",
                *self.extra,
            ],
            self.log,
        )  # fmt: skip

    def health(self) -> dict[str, Any]:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"the router exited: {self.log.read_text()[-2000:]}")
        return HTTP.get(f"{self.url}/healthz", timeout=2).json()  # type: ignore[no-any-return]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(15)
        self.proc = None
