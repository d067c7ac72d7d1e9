"""The demo's command line and page server (standard library ``http.server``).

    python -m vllm_wedlm.demo [--model PATH | --url URL] [--port N] [-- VLLM SERVE FLAGS]

Without ``--url`` it starts ``vllm serve MODEL --decoding wedlm`` on loopback
(:mod:`vllm_wedlm.server_process`; on a CPU with eager mode and a fixed KV budget, as
:mod:`vllm_wedlm.engine_settings` sets them; flags after ``--`` go to ``vllm serve`` after those), then
serves the page on loopback and prints its URL. The page server serves two things: the page
(``page.html``) and ``/config.json`` (the API's base URL, the served model's name, example prompts,
the initial threshold and max_tokens). The page calls the vLLM server itself.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests

from vllm_wedlm import server_process
from vllm_wedlm.checkpoints import MICRO_CHECKPOINT
from vllm_wedlm.evaluation import held_out_tasks, trained_max_number
from vllm_wedlm.training.data.tasks import MAX_NUMBER

PAGE = Path(__file__).with_name("page.html")
DEFAULT_PORT = 8090
DEFAULT_MAX_TOKENS = 256
DEFAULT_ENTROPY_THRESHOLD = 0.4  # WeDLM's default tau
#: vLLM's diffusion counters, which a WeDLM engine fills (vllm_wedlm/adapter/metrics.py).
DIFFUSION_COUNTERS = "vllm:diffusion_num_"


def example_prompts(model: str | None) -> list[dict[str, str]]:
    """Held-out tasks (never trained on) in the model's own number range: four word problems and two
    counting tasks, each with the generator's reference answer."""
    max_number = trained_max_number(model) if model else MAX_NUMBER
    tasks = held_out_tasks(4, ("arithmetic", "counting"), seed=0, max_number=max_number)
    return [
        {"kind": t.kind, "prompt": t.prompt, "reference": t.response}
        for t in tasks["arithmetic"] + tasks["counting"][:2]
    ]


def vllm_serve_args(extra: list[str]) -> list[str]:
    """``vllm serve`` flags of the demo's own server: WeDLM decoding, small-machine settings on a CPU
    (a GPU keeps vLLM's defaults), then the user's flags, which win (argparse keeps the last)."""
    from vllm_wedlm.engine_settings import CPU_KV_CACHE_BYTES, on_gpu

    args = ["--decoding", "wedlm"]
    if not on_gpu():
        args += ["--enforce-eager", "--kv-cache-memory-bytes", str(CPU_KV_CACHE_BYTES)]
    return [*args, *extra]


def served_model(api: str) -> str:
    return requests.get(f"{api}/v1/models", timeout=30).json()["data"][0]["id"]


class PageServer(ThreadingHTTPServer):
    """The page and its ``/config.json`` (``settings``, set before serving)."""

    daemon_threads = True
    settings: dict[str, Any] = {}


class PageHandler(BaseHTTPRequestHandler):
    server: PageServer

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in ("/", "/index.html"):
            self.send(200, "text/html; charset=utf-8", PAGE.read_bytes())
        elif path == "/config.json":
            self.send(200, "application/json", json.dumps(self.server.settings).encode())
        else:
            self.send(404, "text/plain; charset=utf-8", b"not found\n")

    def send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass


def serve_page(server: PageServer, api: str, model_path: str | None, args: argparse.Namespace, launched: bool) -> None:
    """Serve the page for the vLLM server at ``api`` until interrupted."""
    model = served_model(api)
    if not server_process.prometheus_counters(api, DIFFUSION_COUNTERS):
        print(
            f"warning: {api}/metrics has no {DIFFUSION_COUNTERS}* counters (not a --decoding wedlm server, or "
            "started with --disable-log-stats): the page cannot show WeDLM's tokens per forward",
            flush=True,
        )
    server.settings = {
        "api": api,
        "model": model,
        "launched": launched,
        "examples": example_prompts(model_path or model),
        "entropy_threshold": args.entropy_threshold,
        "max_tokens": args.max_tokens,
    }
    print(f"vLLM API: {api} (model {model})", flush=True)
    print(f"WeDLM demo page: http://127.0.0.1:{server.server_address[1]}/  (Ctrl-C stops it)", flush=True)
    server.serve_forever()


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    own, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(
        prog="python -m vllm_wedlm.demo",
        description="A web page streaming AR and WeDLM answers side by side from one vllm serve --decoding wedlm. "
        "Flags after -- go to vllm serve.",
    )
    parser.add_argument(
        "--model", help=f"a WeDLM checkpoint to serve (default: the shipped micro model, {MICRO_CHECKPOINT})"
    )
    parser.add_argument(
        "--url",
        help="use this running `vllm serve ... --decoding wedlm` (e.g. http://127.0.0.1:8000) instead of starting one",
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="the page's port on 127.0.0.1 (0: any free one)")
    parser.add_argument(
        "--entropy-threshold", type=float, default=DEFAULT_ENTROPY_THRESHOLD, help="the page's initial threshold tau"
    )
    parser.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, help="the page's initial max_tokens")
    parser.add_argument("--log", help="where vllm serve's output goes (default: a temporary file)")
    args = parser.parse_args(own)
    if args.url and (args.model or extra):
        parser.error("--url uses a running server: no --model and no vllm serve flags")

    # Both stop the demo and its vllm serve, also where SIGINT came ignored (a background job).
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    # The page's port first: a port in use fails before vLLM spends a minute starting.
    try:
        server = PageServer(("127.0.0.1", args.port), PageHandler)
    except OSError as error:
        parser.error(f"--port {args.port}: {error.strerror} (--port 0 picks a free one)")
    try:
        if args.url:
            serve_page(server, args.url.rstrip("/"), None, args, launched=False)
            return
        model = args.model or str(MICRO_CHECKPOINT)
        if args.log:
            log = Path(args.log)
        else:
            with tempfile.NamedTemporaryFile(prefix="vllm-wedlm-demo-", suffix=".log", delete=False) as f:
                log = Path(f.name)
        serve_args = vllm_serve_args(extra)
        print(
            f"starting vllm serve {model} {' '.join(serve_args)} on 127.0.0.1 (about a minute on a CPU); log: {log}",
            flush=True,
        )
        with server_process.running_server(model, *serve_args, log_path=log) as api:
            serve_page(server, api, model, args, launched=True)
    except KeyboardInterrupt:
        print("stopped", flush=True)
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
