"""Fixed window rows (``fixed_window_rows``; what ``--async-scheduling`` runs on a GPU): a window's
rows are laid out from the runner's device table, so a step needs nothing back on the host from
the step before. Pipelined steps forward 2W rows per window; where the scheduler's gate
(``async_padding_tokens``) finds that padding too costly, a step forwards each window's exact rows
after the step before it. Greedy output must be the reference decoder's, token for token, either
way. A request decoded AR on this engine (``wedlm_decoding: ar``) must be token-exact with an AR
engine's, mixed with windows or not; lossless and adaptive windows run on fixed rows too
(``test_lossless.py``, ``test_adaptive_window.py``).
On the CPU the engine schedules synchronously (vLLM's CPU platform has no async scheduling); on a
GPU the same tests run it with async scheduling.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from conftest import build_checkpoint
from engines import running_llm
from vllm_wedlm.adapter.async_gate import PaddingGate, default_async_scheduling, hides_host_work, padding_gate
from vllm_wedlm.checkpoints.tiny import TinySpec
from vllm_wedlm.config import WeDLMSettings
from vllm_wedlm.core import WeDLMParams
from vllm_wedlm.engine_settings import on_gpu
from vllm_wedlm.models.configuration_wedlm import WeDLMConfig
from vllm_wedlm.models.transformers_body import load_transformers_model
from vllm_wedlm.reference import ReferenceDecoder, StopRule

PROMPTS = ["1, 2, 3, 4", "The quiet river reads the number and the lamp", "Gus",
           "<|im_start|>user\nAda has 12 apples.<|im_end|>\n<|im_start|>assistant\n"]
TAUS = (None, 0.4, 1e9)
LAMBDAS = (0.0, 1.0)
MAX_TOKENS = 24


#: (W, async_padding_tokens): on the CPU (no async scheduling, no knee) 0 forwards every window's
#: exact rows unless all runs are whole, 40 pads the 24 windows of 4 to 2W only while their runs
#: average above 2.3 (the steps alternate), and a huge budget pads every step.
GATES = [(4, 40), (16, 0), (16, 1 << 20)]


@pytest.mark.parametrize("window,padding", GATES)
def test_fixed_rows_equal_reference(tmp_path, window, padding):
    from vllm import SamplingParams

    path = build_checkpoint(tmp_path, TinySpec(variant="qwen3", logit_scale=30.0))
    combos = list(itertools.product(TAUS, LAMBDAS, PROMPTS))
    params = [SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True,
                             extra_args={"wedlm_entropy_threshold": tau, "wedlm_pos_penalty": lam})
              for tau, lam, _ in combos]
    config = {"decoding": "wedlm", "window_size": window, "fixed_window_rows": True, "async_padding_tokens": padding}
    with running_llm(path, dtype="float32", additional_config=config, async_scheduling=True) as llm:
        assert llm.llm_engine.vllm_config.scheduler_config.async_scheduling == on_gpu()
        outputs = llm.generate([p for *_, p in combos], params, use_tqdm=False)
        forwards = sum(llm.collective_rpc("wedlm_request_forwards"))
        layouts = llm.collective_rpc("wedlm_row_layouts")[0]

    reference = ReferenceDecoder(load_transformers_model(path), WeDLMConfig.from_pretrained(path).mask_token_id, window)
    expected_forwards = 0
    for (tau, lam, prompt), out in zip(combos, outputs, strict=True):
        expected = reference.generate(list(out.prompt_token_ids), StopRule(max_tokens=MAX_TOKENS),
                                      WeDLMParams(entropy_threshold=tau, pos_penalty=lam))
        assert list(out.outputs[0].token_ids) == expected.token_ids, (tau, lam, prompt)
        expected_forwards += expected.num_forwards
    # One window forward per reference forward: fixed rows cost no extra steps. Async scheduling
    # may add one per request, scheduled before the step that ends the request is back, and one
    # per window void for a step (its run outgrew the rows the scheduler predicted, while the
    # step before was in flight; a synchronous engine knows every run).
    voids, waits = layouts.pop("void_windows"), layouts.pop("waits")
    assert layouts.pop("w0_redrawn") == 0  # (a fixed W has no window of W 0)
    assert voids == 0 or on_gpu(), voids
    assert waits == 0 or on_gpu(), waits  # a synchronous engine never schedules a step that only waits
    assert 0 <= forwards - expected_forwards - voids <= (len(combos) if on_gpu() else 0)
    # The steps took the layouts the gate should have chosen.
    if padding == 1 << 20 or (on_gpu() and window == 4):  # 24 windows' 2W rows are below a GPU's knee
        assert set(layouts) == {"padded"}, layouts
    elif padding == 0:
        assert layouts.get("exact"), layouts
    else:
        assert layouts.get("padded") and layouts.get("exact"), layouts


#: AR requests on a fixed-rows engine: a short max_model_len, so that some of them end there (the
#: step that would draw past it is held back under async scheduling) and the others by max_tokens.
AR_MAX_MODEL_LEN = 96


def test_fixed_rows_serve_ar_requests_as_an_ar_engine(tmp_path):
    from vllm import SamplingParams

    path = build_checkpoint(tmp_path, TinySpec(variant="qwen2", logit_scale=8.0))
    prompts = PROMPTS + ["7 + 8 = 15. 15 - 4 = " * 3, "Count from 4 to 19 in steps of 3. " * 3]

    def greedy(**extra):
        return SamplingParams(temperature=0.0, max_tokens=80, ignore_eos=True, extra_args=extra or None)

    def token_ids(outputs) -> list[list[int]]:
        return [list(out.outputs[0].token_ids) for out in outputs]

    ar_config = {"decoding": "ar"}
    with running_llm(path, dtype="float32", max_model_len=AR_MAX_MODEL_LEN, additional_config=ar_config) as llm:
        expected = token_ids(llm.generate(prompts, greedy(), use_tqdm=False))
    config = {"decoding": "wedlm", "window_size": 4, "fixed_window_rows": True, "async_padding_tokens": 40}
    with running_llm(path, dtype="float32", max_model_len=AR_MAX_MODEL_LEN, additional_config=config,
                     async_scheduling=True) as llm:
        assert llm.llm_engine.vllm_config.scheduler_config.async_scheduling == on_gpu()
        alone = token_ids(llm.generate(prompts, greedy(wedlm_decoding="ar"), use_tqdm=False))
        ar_forwards = sum(llm.collective_rpc("wedlm_request_forwards"))
        windows = token_ids(llm.generate(prompts, greedy(), use_tqdm=False))
        # Both modes of every prompt in one batch, interleaved.
        mixed = token_ids(llm.generate([p for p in prompts for _ in range(2)],
                                       [greedy(wedlm_decoding=mode) for _ in prompts for mode in ("ar", "wedlm")],
                                       use_tqdm=False))
    lengths = {len(ids) for ids in expected}
    assert 80 in lengths and min(lengths) < 80, lengths  # some end at max_model_len, some at max_tokens
    assert alone == expected
    assert ar_forwards == 0  # AR requests are not windows
    assert mixed[0::2] == expected
    assert mixed[1::2] == windows != expected


@pytest.mark.parametrize("extra", [{"lossless": True}, {"window_size": "auto"}, {"window_tokens": 64}])
def test_fixed_rows_take_every_mode(extra):
    """Lossless and adaptive windows run on fixed rows (``test_lossless.py``, ``test_adaptive_window.py``)."""
    settings = WeDLMSettings.from_additional_config({"decoding": "wedlm", "fixed_window_rows": True, **extra})
    assert settings.fixed_window_rows and (settings.params.lossless or settings.adaptive_window)


def test_fixed_rows_setting_is_a_boolean():
    with pytest.raises(ValueError, match="fixed_window_rows must be true or false"):
        WeDLMSettings.from_additional_config({"decoding": "wedlm", "fixed_window_rows": "yes"})
    assert WeDLMSettings.from_additional_config({"decoding": "wedlm", "fixed_window_rows": True}).fixed_window_rows


QWEN3_8B = SimpleNamespace(hidden_size=4096, num_attention_heads=32, head_dim=128, num_key_value_heads=8,
                           intermediate_size=12288, num_hidden_layers=36)


def test_the_padding_gate_follows_the_step_cost_measured():
    gate = padding_gate(True, QWEN3_8B, None)
    assert gate.knee == 256 and 100 <= gate.budget <= 140, gate
    # W 16 on the 8B shape (lab notebook 5.8): one-token runs pipeline at batch 1 (32 rows under the
    # knee) but not at 16 (512 against 272 rows); whole runs pipeline at any batch (no padding).
    assert gate.pipelines(32, 17) and not gate.pipelines(16 * 32, 16 * 17) and not gate.pipelines(64 * 32, 64 * 17)
    assert gate.pipelines(8 * 32, 8 * 17) and gate.pipelines(64 * 32, 64 * 32)
    # A small model's step is the host's: padding 64 windows of one-token runs still pays.
    small = SimpleNamespace(hidden_size=256, num_attention_heads=4, num_key_value_heads=4, intermediate_size=768,
                            num_hidden_layers=6)
    assert padding_gate(True, small, None).pipelines(64 * 32, 64 * 17)
    assert padding_gate(True, QWEN3_8B, 7) == PaddingGate(budget=7, knee=256)
    # Without async scheduling nothing overlaps: every padding row costs.
    assert padding_gate(False, QWEN3_8B, None) == PaddingGate(budget=0, knee=0)
    assert not padding_gate(False, small, None).pipelines(32, 17)


def test_a_model_too_small_to_hide_the_host_schedules_synchronously_by_default():
    """The start-up rule (``async_gate.default_async_scheduling``): with no scheduling flag, a model
    whose forward at the knee is shorter than the host work that overlap hides (below about 3.4B
    parameters) gets synchronous scheduling and exact rows (faster on the H100, lab notebook 5.16),
    a larger one vLLM's default (None: async); a flag given decides for itself."""
    small = SimpleNamespace(hidden_size=384, num_attention_heads=6, num_key_value_heads=2, intermediate_size=1152,
                            num_hidden_layers=6)  # the "small" recipe's model
    qwen_1_5b = SimpleNamespace(hidden_size=1536, num_attention_heads=12, num_key_value_heads=2,
                                intermediate_size=8960, num_hidden_layers=28)
    qwen_7b = SimpleNamespace(hidden_size=3584, num_attention_heads=28, num_key_value_heads=4,
                              intermediate_size=18944, num_hidden_layers=28)
    assert [hides_host_work(shape) for shape in (small, qwen_1_5b, qwen_7b, QWEN3_8B)] == [False, False, True, True]
    assert default_async_scheduling(None, small) is False and default_async_scheduling(None, QWEN3_8B) is None
    for requested in (True, False):
        assert default_async_scheduling(requested, small) is requested
        assert default_async_scheduling(requested, QWEN3_8B) is requested


def test_async_output_brings_the_window_spans_with_vllms_output():
    """Under async scheduling the fixed-rows runner's spans (the slots after each planned window's
    leading run) ride on vLLM's async output: asked for, it is vLLM's output, every field as it was,
    with the spans by request."""
    import torch
    from vllm.v1.outputs import AsyncModelRunnerOutput, ModelRunnerOutput

    from vllm_wedlm.adapter.outputs import AsyncOutputWithSpans
    from vllm_wedlm.adapter.protocol import WeDLMRunnerOutput

    inner = ModelRunnerOutput(req_ids=["a", "b", "c"], req_id_to_index={"a": 0, "b": 1, "c": 2},
                              sampled_token_ids=[[5, 6], [], [7]])

    class Later(AsyncModelRunnerOutput):  # vLLM's async output type: an output to come
        def get_output(self) -> ModelRunnerOutput:
            return inner

    output = AsyncOutputWithSpans(Later(), ["a", "c"], torch.tensor([3, 0], dtype=torch.int32)).get_output()
    assert isinstance(output, WeDLMRunnerOutput) and output.window_spans == {"a": 3, "c": 0}
    assert (output.req_ids, output.req_id_to_index, output.sampled_token_ids) == (
        inner.req_ids, inner.req_id_to_index, inner.sampled_token_ids)
