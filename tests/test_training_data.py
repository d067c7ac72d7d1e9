"""Training data beyond the task generator: answers cut by a length limit, and real code as chats.

Self-distillation keeps an answer that max_tokens cut (marked ``"finished": false``): training
learns its tokens and no end of turn after them. The standard library's functions become chats
whose answers are their source, split by the prompt's hash like every other data source.
"""

from __future__ import annotations

import ast
import json

import pytest
from transformers import AutoTokenizer

from vllm_wedlm.checkpoints import MICRO_CHECKPOINT
from vllm_wedlm.training.data.chat_data import chat_record, read_chats, write_chats
from vllm_wedlm.training.data.source_code import source_chats, stdlib_functions
from vllm_wedlm.training.recipes import RECIPES
from vllm_wedlm.training.train import Vocabulary, tokenize


def test_a_cut_answer_is_learnt_without_an_end_of_turn(tmp_path):
    path = tmp_path / "chats.jsonl"
    write_chats(path, [chat_record("prose", "Tell me about cups.", "Cups hold water.", {}),
                       chat_record("prose", "Tell me more about cups.", "Cups hold", {}, finished=False)])
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert "finished" not in lines[0] and lines[1]["finished"] is False
    done, cut = read_chats(path)
    assert (done.finished, cut.finished) == (True, False)
    recipe = RECIPES["micro"]
    vocab = Vocabulary.of_tokenizer(AutoTokenizer.from_pretrained(MICRO_CHECKPOINT))
    turn_end = [vocab.im_end_id] * recipe.learnable_im_end
    for task in (done, cut):
        ids, maskable = tokenize(task, vocab, recipe)
        answer = vocab.encode(task.response)
        learnt = ids[maskable].tolist()
        assert learnt == answer + (turn_end if task.finished else [])
    path.write_text(json.dumps({**lines[1], "finished": "no"}) + "\n")
    with pytest.raises(ValueError, match="finished must be true or false"):
        read_chats(path)


def test_standard_library_functions_become_chats_with_their_source():
    train = source_chats("train", 10**6)
    test = source_chats("test", 10**6)
    assert len(train) + len(test) == len(stdlib_functions()) > 1000
    assert source_chats("train", 50) == train[:50]  # deterministic, and a prefix of the whole
    assert not {r["messages"][0]["content"] for r in train} & {r["messages"][0]["content"] for r in test}
    assert not {r["provenance"]["source"] for r in train} & {r["provenance"]["source"] for r in test}
    for record in train[:300] + test[:100]:
        prompt, answer = (m["content"] for m in record["messages"])
        assert record["kind"] == "source" and record["provenance"]["license"] == "PSF-2.0"
        assert answer.startswith("```python\n") and answer.endswith("\n```")
        code = answer[len("```python\n"):-len("\n```")]
        tree = ast.parse(code)  # the source as written: it parses on its own
        name = prompt.split("`")[1].split("(")[0].split(".")[-1]
        assert isinstance(tree.body[0], ast.FunctionDef) and tree.body[0].name == name, prompt
        assert 3 <= len(code.splitlines()) <= 40


def test_distill_shards_split_the_prompts_and_training_reads_every_shard(tmp_path):
    """``pipeline distill WORK --shard I/N`` on N GPUs: each share of the prompts goes to its own file,
    and the train stage reads them all (not an unfinished .partial)."""
    import argparse

    from vllm_wedlm.training.pipeline import _shard, distill_files

    assert _shard("1/4") == (0, 4) and _shard("4/4") == (3, 4)
    for bad in ("0/4", "5/4", "x/2", "2"):
        with pytest.raises(argparse.ArgumentTypeError):
            _shard(bad)
    for name in ("distill.2-of-3.jsonl", "distill.1-of-3.jsonl", "distill.3-of-3.jsonl.partial",
                 "source.jsonl"):
        (tmp_path / name).write_text("")
    assert [p.name for p in distill_files(tmp_path)] == ["distill.1-of-3.jsonl", "distill.2-of-3.jsonl"]
