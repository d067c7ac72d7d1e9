"""What the WeDLM runner hands back to the scheduler each step."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.v1.outputs import ModelRunnerOutput


@dataclass
class WeDLMRunnerOutput(ModelRunnerOutput):
    """vLLM's runner output plus each request's next window.

    ``sampled_token_ids`` holds the tokens committed by this step (possibly none). The next
    window travels with the output (it is pickled to the scheduler like the rest), and the
    scheduler schedules it as the request's next tokens.
    """

    # req_id -> next step's input ids in physical order (filled slots first, then masks)
    next_windows: dict[str, list[int]] = field(default_factory=dict)
