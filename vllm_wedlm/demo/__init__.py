"""A web page that streams AR and WeDLM answers side by side from one ``vllm serve --decoding wedlm``.

    python -m vllm_wedlm.demo                      # serves the shipped micro model, prints the page URL
    python -m vllm_wedlm.demo --model PATH         # any WeDLM checkpoint
    python -m vllm_wedlm.demo --url URL            # a ``vllm serve --decoding wedlm`` already running

The page (``page.html``: plain HTML, CSS and JavaScript, nothing fetched from elsewhere) calls the
OpenAI API of the vLLM server directly (vLLM allows cross-origin requests by default) and reads
its Prometheus counters for the tokens per forward; :mod:`vllm_wedlm.demo.server` serves the page
and its settings, and starts the vLLM server when no ``--url`` is given.
"""

from vllm_wedlm.demo.server import main

__all__ = ["main"]
