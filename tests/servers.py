"""A real ``vllm serve`` process on loopback for the tests."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import requests

from vllm_wedlm import server_process
from vllm_wedlm.engine_settings import serve_args


@contextlib.contextmanager
def running_server(model: Path, *args: str, log_path: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """``vllm serve model *args`` with the test settings of this machine; yields the base URL."""
    dtype = args[args.index("--dtype") + 1] if "--dtype" in args else None
    with server_process.running_server(model, "--seed", "0", *serve_args(dtype), *args, log_path=log_path,
                                       env=env) as base:
        yield base


def model_name(base: str) -> str:
    (model,) = requests.get(f"{base}/v1/models", timeout=30).json()["data"]
    return model["id"]


def post(base: str, route: str, body: dict, stream: bool = False) -> requests.Response:
    response = requests.post(f"{base}{route}", json={"model": model_name(base), **body}, stream=stream, timeout=300)
    assert response.status_code == 200, response.text
    return response


def sse_events(response: requests.Response) -> list[dict]:
    """The JSON payloads of a server-sent-event stream, without the final [DONE]."""
    events = []
    for line in response.iter_lines(decode_unicode=True):
        if line and line.startswith("data: ") and line != "data: [DONE]":
            events.append(json.loads(line[len("data: "):]))
    return events
