"""A ``vllm serve`` process on loopback, and its Prometheus counters.

For users as well as the tests, which is why it ships in the package: the online benchmark
(``python -m benchmarks online``, whose harness lives outside the package and runs against the
installed plugin) serves each decoding mode with it and reads its counters; the tests' servers
(tests/servers.py) wrap it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import requests

STARTUP_TIMEOUT_S = 600


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(model: str | Path, *args: str, log_path: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """``vllm serve model *args`` until the block ends; yields the base URL (``http://host:port``).

    The server's output goes to ``log_path``; ``env`` adds environment variables.
    """
    port = free_port()
    command = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(model),
               "--host", "127.0.0.1", "--port", str(port), *args]
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, **(env or {})})
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(process, base, log_path)
        yield base
    finally:
        stop(process)


def wait_until_healthy(process: subprocess.Popen, base: str, log_path: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"vllm serve exited with {process.returncode}:\n{log_path.read_text()[-4000:]}")
        with contextlib.suppress(requests.RequestException):
            if requests.get(f"{base}/health", timeout=2).status_code == 200:
                return
        time.sleep(1)
    raise TimeoutError(f"vllm serve not healthy after {STARTUP_TIMEOUT_S} s:\n{log_path.read_text()[-4000:]}")


def stop(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGINT)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def prometheus_counters(base: str, prefix: str) -> dict[str, float]:
    """Counters of ``/metrics`` whose names start with ``prefix``, summed over their labels."""
    totals: dict[str, float] = {}
    for line in requests.get(f"{base}/metrics", timeout=30).text.splitlines():
        if line.startswith(prefix):
            name, value = line.split("{")[0].split(" ")[0], float(line.rsplit(" ", 1)[1])
            totals[name] = totals.get(name, 0.0) + value
    return totals
