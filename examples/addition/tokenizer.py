"""An offline character tokenizer for arithmetic: digits, '+', '=', and three special tokens."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
CHARS = list("0123456789+=-* ")


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate([PAD, BOS, EOS, UNK, *CHARS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, vocab[BOS])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                   unk_token=UNK, clean_up_tokenization_spaces=False)


def save_tokenizer(path: Path) -> PreTrainedTokenizerFast:
    tok = build_tokenizer()
    tok.save_pretrained(str(path))
    return tok
