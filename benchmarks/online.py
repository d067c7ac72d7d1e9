"""Online measurements against a real ``vllm serve``: streamed requests under fixed concurrency.

Per request: time to first token (TTFT), end-to-end latency, output tokens (the server's usage
count) and output tok/s (tokens / latency). Per setting: aggregate output tok/s (all tokens over
the wall time from the first send to the last finish), percentiles, accuracy, and tokens per
forward from the server's own Prometheus counters (WeDLM: committed tokens / denoising steps;
n-gram: tokens / (tokens - accepted drafts); AR: 1).
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from benchmarks.modes import Mode, by_engine, runner_env, token_budget
from benchmarks.stats import percentiles
from benchmarks.workload import Prompt, score, take
from vllm_wedlm.server_process import prometheus_counters, running_server

COMMITTED = "vllm:diffusion_num_committed_tokens_total"
DENOISING_STEPS = "vllm:diffusion_num_denoising_steps_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"


@dataclass
class Measured:
    ttft: float
    latency: float
    tokens: int
    text: str


def serve_args(mode: Mode, window_size: int | None, max_concurrency: int, extra: list[str],
               window_tokens: int | None = None) -> list[str]:
    """``vllm serve`` flags of a mode's server: a WeDLM server without a window flag runs the default
    (the adaptive window)."""
    args = ["--decoding", mode.decoding, "--max-num-seqs", str(max_concurrency),
            "--max-num-batched-tokens", str(token_budget(max_concurrency, mode.widest_window(window_size)))]
    if mode.decoding == "wedlm":
        config = mode.additional_config(window_size, window_tokens)
        if "window_size" in config:
            args += ["--wedlm-window-size", str(config["window_size"])]
        if "window_tokens" in config:
            args += ["--wedlm-window-tokens", str(config["window_tokens"])]
    if mode.scheduling:
        args.append("--async-scheduling" if mode.scheduling == "async" else "--no-async-scheduling")
    if mode.ngram_tokens:
        args += ["--speculative-config", json.dumps(mode.speculative_config())]
    return args + extra


async def _one(session, url: str, body: dict) -> Measured:
    start = time.perf_counter()
    ttft, pieces, tokens = None, [], 0
    async with session.post(f"{url}/v1/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"request failed with {response.status}: {await response.text()}")
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            for choice in chunk.get("choices") or []:
                if choice.get("text"):
                    ttft = ttft if ttft is not None else time.perf_counter() - start
                    pieces.append(choice["text"])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    latency = time.perf_counter() - start
    return Measured(ttft if ttft is not None else latency, latency, tokens, "".join(pieces))


async def _load(url: str, bodies: list[dict], concurrency: int) -> tuple[list[Measured], float]:
    import aiohttp

    gate = asyncio.Semaphore(concurrency)

    async def gated(session, body):
        async with gate:
            return await _one(session, url, body)

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        start = time.perf_counter()
        results = await asyncio.gather(*(gated(session, body) for body in bodies))
        return list(results), time.perf_counter() - start


def _tokens_per_forward(mode: Mode, before: dict, after: dict, tokens: int) -> float | None:
    delta = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in after}
    if mode.windows:
        steps = delta.get(DENOISING_STEPS, 0.0)
        return round(delta.get(COMMITTED, 0.0) / steps, 3) if steps else None
    forwards = tokens - delta.get(ACCEPTED, 0.0)
    return round(tokens / forwards, 3) if forwards > 0 else None


def run(model: str, modes: list[Mode], workloads: dict[int, dict[str, list[Prompt]]], *, concurrencies: list[int],
        requests: int, max_tokens: list[int], ignore_eos: bool, window_size: int | None,
        serve_extra: list[str], log_dir: Path | None, progress, window_tokens: int | None = None,
        interleave: bool = False) -> list[dict]:
    """One row per mode x shots x max_tokens x concurrency x task kind (``workloads``: by shots).

    One server per engine, point by point the modes of a server in turn. With ``interleave`` every
    server is started first and stays up, so each point runs every mode back to back and a machine
    whose speed drifts moves them alike (the servers share the machine's memory)."""
    settings = [(shots, kind, prompts, limit, concurrency) for shots, workload in workloads.items()
                for limit in max_tokens for concurrency in concurrencies for kind, prompts in workload.items()]
    total = len(modes) * len(settings)
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="wedlm-bench-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []

    ran: dict[str, dict[str, str]] = {}  # url -> how its engine scheduled (WeDLM servers)

    def measure(servers: list[tuple[list[Mode], str]]) -> None:
        for shots, kind, prompts, limit, concurrency in settings:
            for group, url in servers:
                for mode in group:
                    rows.append(_point(model, url, mode, kind, shots, limit, concurrency,
                                       take(prompts, max(requests, concurrency)), ignore_eos, window_size,
                                       window_tokens))
                    if mode.decoding == "wedlm":
                        rows[-1].update(ran.get(url, {}))
                    progress(len(rows), total, rows[-1])

    with ExitStack() as stack:
        live = []  # with interleave: (modes, url) of every server, all up
        for engine, group in by_engine(modes).items():
            args = serve_args(group[0], window_size, max(concurrencies), serve_extra, window_tokens)
            server = ExitStack()
            stack.callback(server.close)  # a failure anywhere still stops every server
            log_name = "serve-" + engine.replace(":", "-").replace("+", "-") + ".log"
            with runner_env(group[0]):
                url = server.enter_context(running_server(model, *args, log_path=log_dir / log_name))
            ran[url] = server_scheduling((log_dir / log_name).read_text())
            warm = [_body(model, p, group[0], 16, True) for p in take(settings[0][2], max(concurrencies))]
            asyncio.run(_load(url, warm, max(concurrencies)))
            if interleave:
                live.append((group, url))
            else:
                measure([(group, url)])
                server.close()
        measure(live)
    return rows


def server_scheduling(log_text: str) -> dict[str, str]:
    """How a WeDLM server's engine schedules, from the line the plugin logs as it configures the engine
    (``config_hook``): fixed window rows run under async scheduling, exact rows synchronously; {}
    when the log has no such line (not a WeDLM engine)."""
    for line in log_text.splitlines():
        if "WeDLM decoding: window" in line:
            fixed = "fixed window rows" in line
            return {"scheduling": "async" if fixed else "sync", "window_rows": "fixed" if fixed else "exact"}
    return {}


def _point(model: str, url: str, mode: Mode, kind: str, shots: int, limit: int, concurrency: int, batch: list[Prompt],
           ignore_eos: bool, window_size: int | None, window_tokens: int | None) -> dict:
    """One mode's row at one point: ``batch`` sent to the server at ``url``, ``concurrency`` at a time."""
    bodies = [_body(model, p, mode, limit, ignore_eos) for p in batch]
    before = prometheus_counters(url, "vllm:")
    measured, wall = asyncio.run(_load(url, bodies, concurrency))
    tokens = sum(m.tokens for m in measured)
    after = _settled_counters(url, before, tokens)
    return {
        "mode": mode.name, "kind": kind, "concurrency": concurrency, "shots": shots,
        "max_tokens": limit, **mode.window_settings(window_size, window_tokens),
        "requests": len(measured), "output_tokens": tokens, "seconds": round(wall, 4),
        "output_tok_s": round(tokens / wall, 2),
        "tokens_per_forward": _tokens_per_forward(mode, before, after, tokens),
        "accuracy": score(batch, [m.text for m in measured]),
        **percentiles([m.ttft for m in measured], "ttft_s"),
        **percentiles([m.latency for m in measured], "latency_s"),
        **percentiles([m.tokens / m.latency for m in measured], "request_tok_s"),
    }


def _body(model: str, prompt: Prompt, mode: Mode, max_tokens: int, ignore_eos: bool) -> dict:
    body = {"model": model, "prompt": prompt.text, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": ignore_eos, "stream": True, "stream_options": {"include_usage": True}}
    if mode.extra_args():
        body["vllm_xargs"] = mode.extra_args()
    return body


def _settled_counters(url: str, before: dict, tokens: int, timeout: float = 10.0) -> dict:
    """The counters once the last step's stats are recorded (just after its outputs went out)."""
    deadline = time.monotonic() + timeout
    while True:
        after = prometheus_counters(url, "vllm:")
        produced = after.get("vllm:generation_tokens_total", 0.0) - before.get("vllm:generation_tokens_total", 0.0)
        if produced >= tokens or time.monotonic() > deadline:
            return after
        time.sleep(0.1)
