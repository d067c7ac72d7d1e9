"""Each feature of a WeDLM step is written once (issue 71): the two row layouts (``exact_rows.py``,
``fixed_rows.py``) place rows and call the stages, and hold no log-prob, grammar or sampling code of
their own. Read from their source, so a feature written into a layout again fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ADAPTER = Path(__file__).resolve().parents[1] / "vllm_wedlm" / "adapter"
LAYOUTS = ("exact_rows.py", "fixed_rows.py")

# What implements a feature, by the names a layout would call or import to write it again.
FEATURE_NAMES = {
    "log-probs": {"entries", "no_entries", "compute_logprobs", "gather_logprobs", "LogprobsTensors", "_bank",
                  "_keep", "_write_fills", "log_softmax"},
    "grammar": {"masks", "masks_along", "accepted", "follow_verified", "apply_masks", "apply_grammar",
                "apply_token_bitmask_inplace", "fill_bitmask", "validate_tokens", "accept_tokens"},
    "sampling": {"softmax", "multinomial", "topk", "exponential_", "gumbel", "sampling_metadata", "generators",
                 "edit_logits", "apply_custom", "apply_to_logits", "min_p"},
}
FEATURE_MODULES = {
    "log-probs": ("vllm.v1.sample",),
    "grammar": ("xgrammar", "vllm.v1.structured_output"),
    "sampling": ("vllm.v1.sample", "vllm_wedlm.core.logit_edits"),
}
# The stages each layout calls instead: the log-prob stage, the grammar stage and the edits before
# the draws (``RowLayout.edited_rows``), the sampling settings, the grammar stage after them.
STAGE_CALLS = {"fill_rings", "returned", "edited_rows", "sampling_batch", "follow"}


def uses(source: str) -> tuple[set[str], set[str], set[str]]:
    """(names called, imported or read as attributes; modules imported; attributes called) in
    ``source``; annotations (type hints) and local variables are not uses."""
    tree = ast.parse(source)
    hints = {id(node.annotation) for node in ast.walk(tree) if isinstance(node, ast.arg | ast.AnnAssign)
             and node.annotation is not None}
    hints |= {id(node.returns) for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.returns}
    hinted = {id(inner) for node in ast.walk(tree) if id(node) in hints for inner in ast.walk(node)}
    names, modules, called = set(), set(), set()
    for node in ast.walk(tree):
        if id(node) in hinted:
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            names.add(node.func.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
            names.update(alias.name for alias in node.names if alias.name != "LogprobsTensors")
        elif isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            called.add(node.func.attr)
    return names, modules, called


def written_here(source: str) -> dict[str, set[str]]:
    """Per feature, what of it ``source`` writes itself."""
    names, modules, _ = uses(source)
    found = {}
    for feature, feature_names in FEATURE_NAMES.items():
        hits = (names & feature_names) | {m for m in modules for prefix in FEATURE_MODULES[feature]
                                          if m == prefix or m.startswith(prefix + ".")}
        if hits:
            found[feature] = hits
    return found


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_layout_holds_no_log_prob_grammar_or_sampling_code(layout):
    source = (ADAPTER / layout).read_text()
    assert written_here(source) == {}
    _, _, called = uses(source)
    assert STAGE_CALLS <= called, sorted(STAGE_CALLS - called)


def test_the_check_finds_a_feature_written_into_a_layout():
    """The check is not blind: each feature, written the way the layouts once wrote it, is found."""
    samples = {
        "log-probs": "rows = self.token_logprobs.entries(raw_logits, tokens, chosen)\n",
        "grammar": "masks = self.runner.wedlm_grammars.masks([step.req_ids[i] for i in rows])\n",
        "sampling": "meta = self.runner.input_batch.sampling_metadata\n",
    }
    for feature, sample in samples.items():
        assert feature in written_here(sample), feature
    assert "grammar" in written_here("from vllm_wedlm.adapter.grammar_rows import apply_masks\n")
    assert "log-probs" in written_here("from vllm.v1.sample.sampler import Sampler\n")
    hinted = "def f(x: LogprobsTensors) -> LogprobsTensors:\n    return x\n"
    assert written_here(hinted) == {}  # a type hint writes nothing
