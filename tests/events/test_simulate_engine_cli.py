"""`pagedkv route simulate-engine` publishes a stream the independent checker accepts."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

pytest.importorskip("zmq")

from .helpers import free_port
from .shared_tool import checker

pytestmark = pytest.mark.timeout(90)


@pytest.mark.slow
def test_checker_passes_strict_with_drops_against_the_cli_engine() -> None:
    pub, replay = free_port(), free_port()
    sub = checker.Subscriber(
        f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{replay}", start_seq=0, drop_every=3,
        refcount=True, strict=True, min_batches=20,
    )  # fmt: skip
    result: dict = {}
    thread = threading.Thread(
        target=lambda: result.update(sub.run(until_idle=0.5, startup_wait=30))
    )
    thread.start()
    args = ["route", "simulate-engine", "--trace", "synthetic:40:3", "--num-blocks", "300"]
    args += ["--endpoint", f"tcp://*:{pub}", "--replay-endpoint", f"tcp://*:{replay}"]
    proc = subprocess.run(
        [sys.executable, "-m", "pagedkv.cli", *args, "--wait", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    thread.join(40)
    assert proc.returncode == 0, proc.stderr
    assert result["ok"], result["failures"]
    assert result["messages"]["dropped_simulated"] > 0
    assert result["gaps"]["unrecovered_batches"] == 0 and result["events"]["BlockRemoved"] > 0
    cached = int(proc.stderr.split("batches published")[1].split(", ")[1].split()[0])
    assert result["stored"]["total"] == cached
