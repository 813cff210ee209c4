"""Caption -> token ids: a byte-level or a word-level tokenizer built in code, or a CLIP tokenizer
from a local folder.

Either way the result is ``tokenize(captions) -> (B, L)`` int64 ids padded to ``max_length``,
plus the special ids the text encoder needs (its pooled output sits at the end-of-text id).
"""

from __future__ import annotations

from pathlib import Path

import torch

from divergence.errors import UserInputError
from divergence.recipe.model import TokenizerConfig


class ByteTokenizer:
    """UTF-8 bytes as ids 0-255, then begin (256), end (257) and pad (258); nothing to download.

    >>> ByteTokenizer(6)(["hi"]).tolist()
    [[256, 104, 105, 257, 258, 258]]
    """

    bos_token_id, eos_token_id, pad_token_id = 256, 257, 258
    vocab_size = 259

    def __init__(self, max_length: int):
        self.max_length = max_length

    def __call__(self, captions: list[str]) -> torch.Tensor:
        ids = torch.full((len(captions), self.max_length), self.pad_token_id, dtype=torch.int64)
        for row, caption in enumerate(captions):
            body = list(caption.encode("utf-8"))[: self.max_length - 2]
            tokens = [self.bos_token_id, *body, self.eos_token_id]
            ids[row, : len(tokens)] = torch.tensor(tokens)
        return ids


class WordTokenizer:
    """The shapes dataset's words (``data.shapes.caption_words``) as ids ``0..V-1``, any other word as
    unknown (``V``), then begin (``V+1``), end (``V+2``) and pad (``V+3``); nothing to download.

    A caption of the shapes dataset is about 8 words: each attribute (size, colour, shape, a position
    word) is one token, where the byte tokenizer spells it over 3-8 bytes that the text encoder must
    first learn to assemble. Words are split on whitespace, lowercased.

    >>> WordTokenizer(6)(["a red circle"]).tolist()
    [[22, 0, 12, 6, 23, 24]]
    """

    def __init__(self, max_length: int):
        from divergence.data.shapes import caption_words

        self.max_length = max_length
        self.ids = {word: i for i, word in enumerate(caption_words())}
        n = len(self.ids)
        self.unk_token_id, self.bos_token_id, self.eos_token_id, self.pad_token_id = n, n + 1, n + 2, n + 3
        self.vocab_size = n + 4

    def __call__(self, captions: list[str]) -> torch.Tensor:
        ids = torch.full((len(captions), self.max_length), self.pad_token_id, dtype=torch.int64)
        for row, caption in enumerate(captions):
            body = [self.ids.get(word, self.unk_token_id) for word in caption.lower().split()][: self.max_length - 2]
            tokens = [self.bos_token_id, *body, self.eos_token_id]
            ids[row, : len(tokens)] = torch.tensor(tokens)
        return ids


class ClipTokenizer:
    """A transformers ``CLIPTokenizer`` read from a local folder, with the same call interface."""

    def __init__(self, path: str, max_length: int):
        from transformers import CLIPTokenizer

        folder = Path(path)
        if not folder.is_dir():
            raise UserInputError(
                f"model.tokenizer.path {path!r}: not found; put a CLIP tokenizer folder there "
                "(vocab.json, merges.txt, tokenizer_config.json, e.g. the 'tokenizer' folder of "
                "Stable Diffusion 1.5) or override model.tokenizer.path=..."
            )
        self._tok = CLIPTokenizer.from_pretrained(str(folder), local_files_only=True)
        self.max_length = max_length
        self.bos_token_id, self.eos_token_id = self._tok.bos_token_id, self._tok.eos_token_id
        self.pad_token_id, self.vocab_size = self._tok.pad_token_id, len(self._tok)

    def __call__(self, captions: list[str]) -> torch.Tensor:
        return self._tok(
            captions, padding="max_length", max_length=self.max_length, truncation=True, return_tensors="pt"
        ).input_ids


def build_tokenizer(config: TokenizerConfig) -> ByteTokenizer | WordTokenizer | ClipTokenizer:
    if config.kind == "bytes":
        return ByteTokenizer(config.max_length)
    if config.kind == "words":
        return WordTokenizer(config.max_length)
    return ClipTokenizer(config.path, config.max_length)
