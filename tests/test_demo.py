"""The web demo (``python -m vllm_wedlm.demo``) in a real headless Chromium, on a real ``vllm serve``.

The demo starts ``vllm serve <micro model> --decoding wedlm`` itself; Chromium (Debian's ``chromium``
and ``chromium-driver``, which scripts/setup-tests.sh installs) opens the page, a prompt is typed and Run
clicked, and what the page shows is checked against the API: each pane's text and token count
against a non-streamed ``/v1/chat/completions`` of the same request (greedy), and WeDLM's tokens per
forward against the server's own ``/metrics`` counters read around the run. Nothing else talks to
the server meanwhile, so that figure is exact. A screenshot of the finished page goes to pytest's
tmp dir, and also to ``$VLLM_WEDLM_SCREENSHOT`` when that is set.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from vllm_wedlm.checkpoints import MICRO_CHECKPOINT as MICRO
from vllm_wedlm.engine_settings import serve_args
from vllm_wedlm.evaluation import held_out_tasks, trained_max_number
from vllm_wedlm.server_process import prometheus_counters

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
DIFFUSION = "vllm:diffusion_num_"
COMMITTED, FORWARDS = f"{DIFFUSION}committed_tokens_total", f"{DIFFUSION}denoising_steps_total"
TAU = 0.6  # not the server's default (0.4): the page's threshold control must reach the request
STARTUP_TIMEOUT_S = 600
RUN_TIMEOUT_S = 300

# Records each change of the Run button's disabled state (true = disabled), from before the click.
WATCH_RUN_BUTTON = """
const button = document.getElementById("run");
window.runButtonStates = [];
new MutationObserver(() => window.runButtonStates.push(button.disabled))
  .observe(button, {attributes: true, attributeFilter: ["disabled"]});
"""

# Everything the page shows about one pane, read from its DOM.
READ_PANES = """
const read = (mode) => {
  const el = document.querySelector(`#pane-${mode}`), tpf = el.querySelector(".tpf");
  return {state: el.dataset.state, metrics: el.dataset.metrics ?? null,
          text: el.querySelector(".output").textContent, error: el.querySelector(".error").textContent,
          tokens: el.querySelector(".tokens").textContent,
          runs: [...el.querySelectorAll(".output .run")].map((span) => Number(span.dataset.tokens)),
          tpf: tpf.textContent, committed: tpf.dataset.committed ?? null, forwards: tpf.dataset.forwards ?? null};
};
return {ar: read("ar"), wedlm: read("wedlm")};
"""


def held_out_prompt() -> str:
    """A held-out word problem in the micro model's number range, not one of the page's examples."""
    (task,) = held_out_tasks(1, ("arithmetic",), seed=5, max_number=trained_max_number(str(MICRO)))["arithmetic"]
    return task.prompt


@contextlib.contextmanager
def running_demo(*args: str, out: Path) -> Iterator[str]:
    """``python -m vllm_wedlm.demo --port 0 *args`` until the block ends; yields the page's URL."""
    with open(out, "w") as f:
        process = subprocess.Popen(
            [sys.executable, "-m", "vllm_wedlm.demo", "--port", "0", *args], stdout=f, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not (found := re.search(r"WeDLM demo page: (http://\S+)", out.read_text())):
            assert process.poll() is None, f"the demo exited with {process.returncode}:\n{out.read_text()[-4000:]}"
            assert time.monotonic() < deadline, f"no page URL after {STARTUP_TIMEOUT_S} s:\n{out.read_text()}"
            time.sleep(1)
        yield found.group(1)
    finally:
        process.send_signal(signal.SIGTERM)  # the demo stops its vllm serve (if it started one), then itself
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo on the micro model, starting its own vllm serve; yields (page URL, the page's settings)."""
    root = tmp_path_factory.mktemp("demo")
    # The tests' server settings for this machine go to vllm serve, after "--". A fixed W: the page's
    # answer is compared with the API's token for token, which the adaptive window (the default) makes
    # depend on what the server saw before and on its step times (README, "Reproducible output").
    args = ("--model", str(MICRO), "--log", str(root / "vllm-serve.log"), "--", "--seed", "0", *serve_args(),
            "--wedlm-window-size", "16")
    with running_demo(*args, out=root / "demo.out") as page:
        yield page, requests.get(f"{page}config.json", timeout=30).json()


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    assert CHROMIUM.exists() and CHROMEDRIVER.exists(), (
        "headless Chromium is needed: apt-get install chromium chromium-driver (scripts/setup-tests.sh does it as root)"
    )
    options = Options()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def run_on_page(browser, page: str, prompt: str, tau: float) -> dict:
    """Load the page, type ``prompt`` and ``tau``, click Run, wait until the page is done; what it shows."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(page)
    run = browser.find_element(By.ID, "run")
    WebDriverWait(browser, 30).until(lambda _: run.is_enabled())  # the settings are loaded
    box = browser.find_element(By.ID, "prompt")
    box.clear()
    box.send_keys(prompt)
    threshold = browser.find_element(By.ID, "tau")
    threshold.clear()
    threshold.send_keys(str(tau))
    # Disabled from the click until both panes and the metrics are done. Recorded by the page
    # itself: a run that fails fast (a 400) can end before a WebDriver call could look.
    browser.execute_script(WATCH_RUN_BUTTON)
    run.click()
    WebDriverWait(browser, RUN_TIMEOUT_S).until(lambda _: run.is_enabled())
    assert browser.execute_script("return window.runButtonStates;") == [True, False]
    return browser.execute_script(READ_PANES)


@pytest.fixture(scope="module")
def shown(demo, browser, tmp_path_factory):
    """One run of the page on a held-out prompt: what it shows, with the /metrics delta around it."""
    page, config = demo
    before = prometheus_counters(config["api"], DIFFUSION)
    panes = run_on_page(browser, page, held_out_prompt(), TAU)
    after = prometheus_counters(config["api"], DIFFUSION)
    screenshot = tmp_path_factory.mktemp("screenshot") / "demo.png"
    browser.save_screenshot(str(screenshot))
    if os.environ.get("VLLM_WEDLM_SCREENSHOT"):
        shutil.copyfile(screenshot, os.environ["VLLM_WEDLM_SCREENSHOT"])
    delta = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in (COMMITTED, FORWARDS)}
    return panes, delta, screenshot


def api_answer(config: dict, xargs: dict) -> requests.Response:
    """The same request as the page's, not streamed."""
    body = {
        "model": config["model"],
        "messages": [{"role": "user", "content": held_out_prompt()}],
        "temperature": 0,
        "max_tokens": config["max_tokens"],
        "vllm_xargs": xargs,
    }
    return requests.post(f"{config['api']}/v1/chat/completions", json=body, timeout=300)


def test_the_page_serves_its_settings_and_held_out_examples(demo):
    page, config = demo
    assert config["model"] == str(MICRO) and config["launched"] is True
    assert config["entropy_threshold"] == 0.4 and config["max_tokens"] > 0
    examples = held_out_tasks(4, ("arithmetic", "counting"), max_number=trained_max_number(str(MICRO)))
    assert [e["prompt"] for e in config["examples"]] == [t.prompt for t in examples["arithmetic"]] + [
        t.prompt for t in examples["counting"][:2]
    ]
    assert requests.get(f"{config['api']}/health", timeout=30).status_code == 200


def test_with_url_the_demo_serves_the_page_for_a_running_server(demo, tmp_path):
    page, config = demo
    with running_demo("--url", config["api"] + "/", out=tmp_path / "demo.out") as other:
        assert other != page
        assert "<title>WeDLM vs AR" in requests.get(other, timeout=30).text
        assert requests.get(f"{other}config.json", timeout=30).json() == {**config, "launched": False}
    assert requests.get(f"{config['api']}/health", timeout=30).status_code == 200  # left running


def test_the_wedlm_pane_streams_committed_runs_and_equals_the_api(demo, shown):
    _, config = demo
    panes, delta, screenshot = shown
    wedlm = panes["wedlm"]
    assert wedlm["state"] == "done" and wedlm["error"] == "", wedlm
    answer = api_answer(config, {"wedlm_entropy_threshold": TAU})
    assert answer.status_code == 200, answer.text
    assert wedlm["text"] == answer.json()["choices"][0]["message"]["content"]
    tokens = answer.json()["usage"]["completion_tokens"]
    assert int(wedlm["tokens"]) == tokens
    # Each highlight is one streamed run; together they are the answer's tokens, several at a time.
    assert sum(wedlm["runs"]) == tokens and max(wedlm["runs"]) > 1
    # Tokens per forward: the server's counters around the run, exactly as the page shows them.
    assert wedlm["metrics"] == "done"
    assert (float(wedlm["committed"]), float(wedlm["forwards"])) == (delta[COMMITTED], delta[FORWARDS])
    assert delta[COMMITTED] >= tokens and 0 < delta[FORWARDS] < tokens
    assert wedlm["tpf"] == f"{delta[COMMITTED] / delta[FORWARDS]:.2f}"
    assert screenshot.stat().st_size > 10_000


def test_the_ar_pane_equals_the_ar_mode_of_the_api(demo, shown):
    """Needs the per-request AR mode of a WeDLM server (``vllm_xargs: {"wedlm_decoding": "ar"}``)."""
    _, config = demo
    panes, *_ = shown
    ar = panes["ar"]
    answer = api_answer(config, {"wedlm_decoding": "ar"})
    assert answer.status_code == 200, answer.text
    assert ar["state"] == "done" and ar["error"] == "", ar
    assert ar["text"] == answer.json()["choices"][0]["message"]["content"]
    tokens = answer.json()["usage"]["completion_tokens"]
    assert int(ar["tokens"]) == tokens and sum(ar["runs"]) == tokens
    assert ar["tpf"] == "1"


def test_an_api_error_is_shown_in_its_pane(demo, browser):
    page, _ = demo
    panes = run_on_page(browser, page, held_out_prompt(), -1.0)  # the server refuses a negative threshold
    wedlm = panes["wedlm"]
    assert wedlm["state"] == "error" and wedlm["text"] == "" and wedlm["runs"] == []
    assert wedlm["error"].startswith("API error 400: ") and "entropy_threshold must be a positive" in wedlm["error"]
