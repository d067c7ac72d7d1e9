"""A source tokenizer saved so that it splits text exactly as the source does, and the check of it.

transformers picks a tokenizer class from the checkpoint: for a ``model_type: qwen2`` directory it
swaps in ``Qwen2Tokenizer``, with Qwen's pre-tokenizer and an NFC normalizer, whatever the saved
``tokenizer.json`` says; a Llama-family tokenizer then splits code and newlines differently from
its training. A WeDLM checkpoint written here names the plain fast tokenizer class, which runs the
saved ``tokenizer.json`` as it is: the source's own pre-tokenizer, normalizer and merges.
"""

from __future__ import annotations

import json
from pathlib import Path

from transformers import PreTrainedTokenizerBase

#: The class a converted checkpoint's tokenizer_config.json names: transformers' fast tokenizer over
#: tokenizer.json as saved (TokenizersBackend in transformers 5).
TOKENIZER_CLASS = "PreTrainedTokenizerFast"
#: Keys transformers writes into tokenizer_config.json about the machine that saved it.
_LOCAL_KEYS = ("is_local", "local_files_only")

#: Texts whose token ids must not change: code, prose, runs of spaces, tabs and newlines, digits,
#: unicode (composed and decomposed accents, full-width letters, CJK, emoji) and ChatML.
SPLITTING_CORPUS = (
    "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "for (int i = 0; i < 10; ++i) {\n\tprintf(\"%d\\n\", i);\n}\n",
    "class Stack:\n\n\n    def push(self, item):\n        self._items.append(item)  # O(1)\n",
    "The quick brown fox jumps over the lazy dog. It was the best of times, it was the worst of times.",
    "Photosynthesis converts light energy into chemical energy; plants, algae and some bacteria use it.",
    "   leading spaces, trailing spaces   \n\n\n\nblank lines\r\nwindows line\t\ttabs \t mixed",
    "        \n    \n\t\n",
    "12345678901234567890 3.14159 -42 1,000,000 0x1F 2024-06-01 10:30:59 1e-5 007",
    "Mo has 6 cups. Then Mo buys 2 more.\n6 + 2 = 8.\nThe answer is 8.",
    "café naïve coöperate Ångström résumé — “quotes” ‘single’ … ½ × ÷ ≤ ≥ ∑ π",
    "cafe\u0301 e\u0308 A\u030a",  # decomposed accents: an NFC normalizer would change these
    "Ｆｕｌｌ－ｗｉｄｔｈ ＡＢＣ １２３ 東京は日本の首都です。 서울 Привет мир 🙂👍🏽🚀",
    "<|im_start|>user\nCount from 1 to 5.<|im_end|>\n<|im_start|>assistant\n1, 2, 3, 4, 5.<|im_end|>\n",
    "<|endoftext|>text after a special token<|im_end|>",
)


def splitting_differences(expected: PreTrainedTokenizerBase, actual: PreTrainedTokenizerBase,
                          texts: tuple[str, ...] = SPLITTING_CORPUS) -> list[str]:
    """The texts that ``actual`` encodes to other ids than ``expected`` (no special tokens added)."""
    return [text for text in texts
            if expected(text, add_special_tokens=False).input_ids != actual(text, add_special_tokens=False).input_ids]


def template_differences(expected: PreTrainedTokenizerBase, actual: PreTrainedTokenizerBase) -> list[str]:
    """Chats that the two tokenizers' chat templates render differently (a prompt, a whole chat)."""
    chats = ([{"role": "user", "content": "What is 2 + 2?"}],
             [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."},
              {"role": "assistant", "content": "Blue."}])
    differences = []
    for chat in chats:
        prompt = chat[-1]["role"] == "user"
        want = expected.apply_chat_template(chat, add_generation_prompt=prompt, tokenize=False)
        got = actual.apply_chat_template(chat, add_generation_prompt=prompt, tokenize=False)
        if want != got:
            differences.append(want)
    return differences


def save_tokenizer(tokenizer: PreTrainedTokenizerBase, out: Path, model_max_length: int) -> None:
    """Save ``tokenizer`` into ``out`` so that ``AutoTokenizer`` loads it as the fast tokenizer of the
    saved tokenizer.json, whatever class it was loaded as."""
    tokenizer.save_pretrained(out)
    path = out / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    for key in _LOCAL_KEYS:
        config.pop(key, None)
    config.update(tokenizer_class=TOKENIZER_CLASS, model_max_length=model_max_length)
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
