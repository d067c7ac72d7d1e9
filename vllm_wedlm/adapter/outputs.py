"""What the WeDLM runner hands back to the scheduler each step."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.v1.outputs import ModelRunnerOutput


@dataclass
class WeDLMRunnerOutput(ModelRunnerOutput):
    """vLLM's runner output plus each request's next window.

    ``sampled_token_ids`` holds the tokens this step decided (possibly none). The next window
    travels with the output (it is pickled to the scheduler like the rest), and the scheduler
    schedules it as the request's next draft tokens.
    """

    # req_id -> next step's draft tokens in physical order (filled slots first, then masks)
    next_windows: dict[str, list[int]] = field(default_factory=dict)
    # req_id -> how many of this step's sampled tokens lead the request's next window: decided
    # (every slot before them filled) but not forwarded yet. vLLM counts every sampled token of a
    # request with drafts as an accepted draft, whose KV this step wrote; these have none yet.
    unforwarded: dict[str, int] = field(default_factory=dict)
