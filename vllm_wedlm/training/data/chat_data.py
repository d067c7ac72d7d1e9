"""Chat data files: JSON lines, one single-turn chat each, with where it came from.

    {"messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}],
     "kind": "prose", "provenance": {"model": "...", "sampling": {...}, ...}}

``kind`` groups chats in the training log and in ``--oversample``; ``provenance`` is free-form (the
distillation command writes the model, the prompt's source and the sampling). ``"finished": false``
marks an answer cut by a length limit: training learns its tokens but no end of turn after them.
Training renders the user turn with the checkpoint's chat template (tasks.chat_prompt) and learns
the assistant turn.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from vllm_wedlm.training.data.tasks import Task


def chat_record(kind: str, prompt: str, answer: str, provenance: dict, finished: bool = True) -> dict:
    record = {"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}],
              "kind": kind, "provenance": provenance}
    if not finished:
        record["finished"] = False
    return record


def write_chats(path: str | Path, records: Iterable[dict]) -> int:
    """Append ``records`` to a chat data file; how many were written."""
    count = 0
    with open(path, "a", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            count += 1
    return count


def read_chats(path: str | Path) -> list[Task]:
    """The chats of a chat data file as training tasks; a malformed line is a ValueError naming it."""
    tasks = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                messages = record["messages"]
                roles = [m["role"] for m in messages]
                if roles != ["user", "assistant"]:
                    raise ValueError(f"expected a user and an assistant message, got roles {roles}")
                finished = record.get("finished", True)
                if not isinstance(finished, bool):
                    raise ValueError(f"finished must be true or false, got {finished!r}")
                tasks.append(Task(str(record.get("kind", "chat")), messages[0]["content"], messages[1]["content"],
                                  finished=finished))
            except (ValueError, KeyError, TypeError) as error:
                raise ValueError(f"{path}:{number}: not a chat record ({error})") from error
    if not tasks:
        raise ValueError(f"{path} holds no chats")
    return tasks
