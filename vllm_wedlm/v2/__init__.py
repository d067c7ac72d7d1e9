"""WeDLM on vLLM's Model Runner V2 (vLLM 0.34; issue 70): the first slice of the binding.

Nothing here is imported by the package or by the V1 adapter (vLLM 0.26), and these modules import
vLLM 0.34's V2 classes, so they are imported only where vLLM 0.34 is installed:

* ``window_table.py``: each request slot's window, kept on the device between steps, and one
  step's plan of them (pure torch);
* ``model_state.py``: ``WeDLMModelState``, vLLM's ``ModelState`` for a WeDLM model: per-slot windows,
  the window's rows in physical order at logical RoPE positions, and the sampler hook;
* ``sampler.py``: ``WeDLMSampler``, which runs ``core`` (select, fill, commit) in place of vLLM's
  sampler and reports each window's committed run as the step's sampled tokens;
* ``scheduler.py``: ``WeDLMScheduler``, vLLM's ``DiffusionScheduler`` for a model that is not
  marked ``is_diffusion``: no bonus token, a canvas of placeholders for every window, and a request
  that draws from AR rows kept one token short (its next token is its canvas's first row);
* ``context_edits.py``: penalties and bad words on the canvas rows, each row over the tokens before it;
* ``grammar_stage.py``: structured outputs, the V1 binding's per-request matchers placed on canvas rows;
* ``request_validator.py``: the front end's per-request checks (WeDLM keys);
* ``model.py`` / ``registration.py``: the model class that names the state, and what the plugin
  registers with vLLM 0.34.

A window's forward is a canvas of a fixed 2 W rows (``canvas_width``): its committed run, at most
W, then W undecided slots, then padding rows, which causal attention keeps from the others.
It runs plain WeDLM, lossless and per-request AR (a lossless window of one row), at a fixed W, under
synchronous scheduling, with each request's sampling settings (seeds included), its logit edits
(allowed ids, logit bias, min_tokens), penalties, bad words, thinking budget, structured outputs,
log-probs and prompt log-probs (the log-prob stage of
``adapter/token_logprobs.py``, which the V1 binding uses too).
"""
