"""A request's prompt log-probs, held on the scheduler's side until its first step that returns tokens.

vLLM hands over a request's prompt log-probs with the step that completes its prompt, and requires
that step to return tokens too (an AR step always does; vLLM 0.34 asserts it: "EngineCore returns no
partial prefill outputs"). A WeDLM request's prompt step may return nothing: a plain window's first
run is reported by a later forward, and on the V2 binding a prefill has no logits row at all. So its
prompt's entries wait here for its first step that returns tokens. Both bindings' schedulers use
it; on vLLM 0.34 the scores of ``prompt_logprob_token_ids`` travel the same way.
"""

from __future__ import annotations

#: The runner output's per-request prompt fields (those this vLLM has).
PROMPT_FIELDS = ("prompt_logprobs_dict", "prompt_token_id_logprobs_dict")


class HeldPromptLogprobs:
    def __init__(self) -> None:
        self._held: dict[str, dict[str, object]] = {}  # req_id -> field -> its value

    def hold(self, output, requests: dict) -> None:
        """Move, in the runner's ``output`` (vLLM's ``ModelRunnerOutput``, before the scheduler reads
        it), the prompt entries of requests that return no tokens now into the hold, and give back
        those held for requests that do; forget those of requests gone (``requests``: the
        scheduler's, by id) before their first token."""
        fields = {name: getattr(output, name) for name in PROMPT_FIELDS if getattr(output, name, None) is not None}
        if not any(fields.values()) and not self._held:
            return
        sampled = output.sampled_token_ids
        index = {req_id: i for i, req_id in enumerate(output.req_ids)}

        def returns_tokens(req_id: str) -> bool:
            return bool(sampled) and req_id in index and len(sampled[index[req_id]]) > 0

        for name, computed in fields.items():
            for req_id in [r for r, value in computed.items() if value is not None and not returns_tokens(r)]:
                self._held.setdefault(req_id, {})[name] = computed.pop(req_id)
        for req_id in list(self._held):
            request = requests.get(req_id)
            if request is None or request.is_finished():
                del self._held[req_id]  # aborted before its first token
            elif returns_tokens(req_id):
                for name, value in self._held.pop(req_id).items():
                    fields[name][req_id] = value
