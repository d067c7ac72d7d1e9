"""Installing the plugin changes nothing in vLLM's metrics until a user asks for WeDLM.

vLLM 0.26's ``AsyncLLM`` turns statistics on for every engine as soon as any
``vllm.stat_logger_plugins`` entry point is installed, and a Prometheus logger found there
replaces vLLM's own. So the A/B here serves a plain Qwen3 model (nothing to do with WeDLM) with
statistics off, once with the plugin installed and once with it switched off (``VLLM_PLUGINS``
naming every installed plugin but this one: stock vLLM, its own plugins included), and compares
``/metrics`` family by family. With statistics
on, tests/test_serve_ar.py and tests/test_serve_wedlm.py compare the AR and WeDLM servers' families
with those of vLLM's own logger.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from metric_families import served_families
from plain_qwen import plain_qwen3_copy
from servers import post, running_server


@pytest.fixture(scope="module")
def plain_qwen(tiny_checkpoints, tmp_path_factory):
    return plain_qwen3_copy(tiny_checkpoints["qwen3"], tmp_path_factory.mktemp("plain") / "qwen3")


def without_this_plugin() -> dict[str, str]:
    """vLLM's plugin allowlist with every installed plugin but this one (vLLM ships its own)."""
    from importlib.metadata import entry_points

    others = sorted({ep.name for group in ("vllm.general_plugins", "vllm.stat_logger_plugins")
                     for ep in entry_points(group=group)} - {"wedlm"})
    return {"VLLM_PLUGINS": ",".join(others)}


def test_installed_plugin_leaves_metrics_of_an_ar_server_as_stock_vllm(plain_qwen, tmp_path):
    served = {}
    for name, env in (("plugin installed", {}), ("stock vLLM", without_this_plugin())):
        with running_server(plain_qwen, "--disable-log-stats", log_path=tmp_path / f"{name}.log", env=env) as base:
            body = {"prompt": "1, 2", "max_tokens": 3, "temperature": 0, "return_token_ids": True}
            assert len(post(base, "/v1/completions", body).json()["choices"][0]["token_ids"]) == 3
            served[name] = served_families(base)
    assert served["plugin installed"] == served["stock vLLM"]


def plugins_vllm_loads(env: dict[str, str]) -> dict[str, list[str]]:
    code = ("import json; from vllm.plugins import load_plugins_by_group as load; "
            "print(json.dumps({g: sorted(load(g)) for g in ('vllm.general_plugins', 'vllm.stat_logger_plugins')}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_ab_switch_switches():
    """The comparison above compares something: the allowlist leaves exactly this plugin out, and
    the installed plugin offers vLLM no stat logger."""
    installed, stock = plugins_vllm_loads({}), plugins_vllm_loads(without_this_plugin())
    assert installed["vllm.general_plugins"] == sorted([*stock["vllm.general_plugins"], "wedlm"])
    assert installed["vllm.stat_logger_plugins"] == stock["vllm.stat_logger_plugins"] == []
