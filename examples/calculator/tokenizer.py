"""An offline character tokenizer with a chat template for the calculator agent.

Roles and turn ends are special tokens; the tool tags are single (non-special) tokens, so the model sees
`<calc>` as one symbol and decoding keeps them. The template renders each message as <|role|>content<|end|> and
the generation prompt as <|assistant|>.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, EOS, UNK = "<pad>", "<|end|>", "<unk>"
ROLES = ("<|user|>", "<|assistant|>", "<|tool|>")
TAGS = ("<calc>", "</calc>", "<result>", "</result>")
CHARS = list("0123456789+-*= ")
CHAT_TEMPLATE = ("{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] + '<|end|>' }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}")


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate([PAD, EOS, UNK, *ROLES, *TAGS, *CHARS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD, unk_token=UNK,
                                   additional_special_tokens=list(ROLES), clean_up_tokenization_spaces=False)
    fast.add_tokens(list(TAGS))
    fast.chat_template = CHAT_TEMPLATE
    return fast


def save_tokenizer(path: Path) -> PreTrainedTokenizerFast:
    tok = build_tokenizer()
    tok.save_pretrained(str(path))
    return tok
