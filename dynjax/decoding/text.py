"""Text in and out of the decoder: a prompt to token ids, and each new token to what it adds
to the printed text. A checkpoint says which it uses (``Target.text()``, docs/targets.md)."""
from __future__ import annotations

import codecs


class ByteText:
    """A train.py run's text: UTF-8 bytes in, bytes out (a split character waits)."""
    stop = frozenset()

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def printer(self, prompt_ids):
        """``(add, flush)``: ``add(token)`` is the text the token completes, ``flush()`` the rest."""
        out = codecs.getincrementaldecoder("utf-8")(errors="replace")
        return lambda tok: out.decode(bytes([tok])), lambda: out.decode(b"", final=True)


class TokenizerText:
    """Text through a ``tokenizers.Tokenizer`` (an HF checkpoint's tokenizer.json), stopping at
    ``eos`` (config.json's ``eos_token_id``: an id, a list of them, or None).

    A token's text depends on its neighbours (merged pieces, a leading space the decoder strips
    at the start, a character split over byte tokens), so each step decodes a short window, the
    last ``CONTEXT`` tokens already printed and those not yet printed, and prints what the new
    tokens add to it; text ending in an unfinished character (U+FFFD) waits for the next token.
    Each step costs a few tokens' decoding, not the whole continuation's."""

    CONTEXT = 4

    def __init__(self, tokenizer, eos=None):
        self.tok = tokenizer
        self.stop = frozenset(eos if isinstance(eos, list) else [] if eos is None else [eos])

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text).ids

    def printer(self, prompt_ids):
        """``(add, flush)`` as :meth:`ByteText.printer`."""
        ids = list(prompt_ids)
        read = [len(ids)]          # the first token not printed yet

        def new_text(final=False):
            start = max(read[0] - self.CONTEXT, 0)
            shown = self.tok.decode(ids[start:read[0]])
            text = self.tok.decode(ids[start:])
            if len(text) <= len(shown) or (text.endswith("\ufffd") and not final):
                return ""
            read[0] = len(ids)
            return text[len(shown):]

        def add(tok):
            ids.append(tok)
            return new_text()
        return add, lambda: new_text(final=True)
