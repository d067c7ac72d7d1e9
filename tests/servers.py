"""A real ``vllm serve`` process on loopback for the tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import requests

from vllm_wedlm.testing import serve_args

STARTUP_TIMEOUT_S = 600


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(model: Path, *args: str, log_path: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """``vllm serve model *args`` until the block ends; yields the base URL (``http://host:port``).

    ``env``: extra environment variables of the server process.
    """
    port = free_port()
    command = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(model),
               "--host", "127.0.0.1", "--port", str(port), "--seed", "0", *serve_args(), *args]
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


def model_name(base: str) -> str:
    (model,) = requests.get(f"{base}/v1/models", timeout=30).json()["data"]
    return model["id"]


def post(base: str, route: str, body: dict, stream: bool = False) -> requests.Response:
    response = requests.post(f"{base}{route}", json={"model": model_name(base), **body}, stream=stream, timeout=300)
    assert response.status_code == 200, response.text
    return response


def prometheus_counters(base: str, prefix: str) -> dict[str, float]:
    """Counters of ``/metrics`` whose names start with ``prefix``, summed over their labels."""
    totals: dict[str, float] = {}
    for line in requests.get(f"{base}/metrics", timeout=30).text.splitlines():
        if line.startswith(prefix):
            name, value = line.split("{")[0].split(" ")[0], float(line.rsplit(" ", 1)[1])
            totals[name] = totals.get(name, 0.0) + value
    return totals


def sse_events(response: requests.Response) -> list[dict]:
    """The JSON payloads of a server-sent-event stream, without the final [DONE]."""
    events = []
    for line in response.iter_lines(decode_unicode=True):
        if line and line.startswith("data: ") and line != "data: [DONE]":
            events.append(json.loads(line[len("data: "):]))
    return events
