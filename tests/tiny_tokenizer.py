"""A tiny real tokenizer with a chat template, trained in well under a second.

Unit tests use it instead of a mock: it goes through the same AutoTokenizer and
apply_chat_template code paths as a real model's tokenizer.
"""

from __future__ import annotations

from pathlib import Path

# Raises on a developer message, as real templates raise on what they cannot render.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message.role == 'developer' %}{{ raise_exception('no developer messages') }}"
    "{% endif %}<|im_start|>{{ message.role }}\n"
    "{{ message.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}"
    "{% endif %}"
)
SPECIAL_TOKENS = ["<unk>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
CORPUS = [
    "What is the capital of France ? The capital of France is Paris .",
    "What is the capital of Finland ? The capital of Finland is Helsinki .",
    "user assistant system tool hello world this is a prompt about caching blocks",
    "the quick brown fox jumps over the lazy dog again and again",
]


def build_tiny_tokenizer(directory: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.train_from_iterator(CORPUS, trainers.WordLevelTrainer(special_tokens=SPECIAL_TOKENS))
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        eos_token="<|im_end|>",
        chat_template=CHAT_TEMPLATE,
    )
    wrapped.save_pretrained(str(directory))
    return directory
