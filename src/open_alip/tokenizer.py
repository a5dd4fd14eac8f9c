"""The CLIP byte-pair-encoding tokenizer, id-for-id equal to the reference one.

RWKV-CLIP, ALIP and open_clip all feed their text towers with OpenAI CLIP's BPE
tokenizer. Token ids end up inside training records, so "close enough" is not good
enough: `tokenize` must give exactly the ids of open_clip's `tokenize` (same
ftfy version) for every input, however broken. The equivalence test in
tests/test_tokenizer.py checks that against the real open_clip on a large corpus.

What makes it faster than the reference, without changing a single id:

* Text cleaning (ftfy) dominates the reference's cost, and most captions are
  text whose cleaning is provably trivial (`_clean_words`):
  - printable ASCII (plus tab/LF/CR/form feed) with no '&' that could start an
    entity: nothing to unescape, no mojibake, no control character, ligature,
    wide form or curly quote, NFC does not touch ASCII, and the line-break fix
    only swaps one whitespace for another, which the whitespace collapse erases;
  - other one-segment text (no line break, under ftfy's segment length) on which
    ftfy 6.3.1's loop provably settles after at most its three translating fixers
    (ligatures, width forms, curly quotes): ftfy's own mojibake detector passes it
    before and after, it holds no character from ftfy's other fix tables and no
    possible entity, and the result is NFC (`_simple_ftfy`, built from ftfy's
    own tables and functions).
  Everything else takes the reference's cleaning path.
* No match of the splitting pattern can contain a space, so the cleaned text can
  be cut at spaces and each piece's ids cached: captions are built from a small
  vocabulary of words, so most pieces are a dictionary hit.
* Only the first `context_length - 2` ids of a text can reach the output, so
  encoding stops there.
"""

from __future__ import annotations

import gzip
import html
import re as std_re
import unicodedata
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ftfy
import numpy as np
import regex
from ftfy.badness import is_bad

from .constants import CONTEXT_LENGTH

if TYPE_CHECKING:
    import torch

VOCAB_PATH = Path(__file__).with_name("bpe_simple_vocab_16e6.txt.gz")

# The merge list has more lines than CLIP uses; CLIP's vocabulary is 256 bytes,
# their 256 end-of-word forms, these merges and the 2 special tokens: 49408 ids.
_NUM_MERGES = 49152 - 256 - 2
_SPECIAL_TOKENS = ("<start_of_text>", "<end_of_text>")
_END_OF_WORD = "</w>"

# An '&' that could begin an entity for html.unescape or ftfy: both need at least
# one character after it other than whitespace ("Tom & Jerry" is safe).
_ENTITY_START = r"&(?![\t\n\f ]|\Z)"
# Text that could make ftfy or html.unescape change a string: anything non-ASCII, a
# possible entity, and the control characters ftfy removes or rewrites. Tab, LF,
# form feed and CR are allowed: the whitespace collapse treats them like spaces.
_NEEDS_FULL_CLEAN = std_re.compile(r"[^\t\n\f\r -~]|" + _ENTITY_START)

# Bound on each ids cache; when full it is emptied (it refills with the
# frequent words within a few thousand captions).
_CACHE_LIMIT = 1 << 17


def _byte_symbols() -> tuple[list[str], list[str]]:
    """One printable character per byte value, in CLIP's vocabulary order.

    Bytes that are visible Latin-1 characters stand for themselves; the others
    (controls, space, soft hyphen, ...) get code points from 256 up, so that BPE
    never sees whitespace or control characters. The list order is the id order
    of the first 256 vocabulary entries.
    """
    visible = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shown = set(visible)
    hidden = [b for b in range(256) if b not in shown]
    byte_order = visible + hidden
    chars = [chr(b) for b in visible] + [chr(256 + n) for n in range(len(hidden))]
    by_byte = [""] * 256
    for byte, char in zip(byte_order, chars):
        by_byte[byte] = char
    return chars, by_byte


def _ftfy_patterns() -> tuple[std_re.Pattern[str], std_re.Pattern[str]] | None:
    """Text that some ftfy fixer would rewrite, from ftfy's own tables.

    Returns (any such text, such text other than what the three translating fixers
    handle), or None, disabling the non-ASCII shortcut, for any ftfy but the one
    this was checked against.
    """
    if ftfy.__version__ != "6.3.1":
        return None
    from ftfy import chardata, fixes

    def char_class(codes: set[int]) -> str:
        return "[" + "".join(std_re.escape(chr(c)) for c in sorted(codes)) + "]"

    # Line breaks would split the text into several ftfy segments.
    untranslatable = [
        char_class({*chardata.CONTROL_CHARS, *(ord(c) for c in "\n\r\x85\u2028\u2029")}),
        chardata.C1_CONTROL_RE.pattern,
        fixes.SURROGATE_RE.pattern,
        _ENTITY_START,
    ]
    translatable = [
        char_class({*chardata.LIGATURES, *chardata.WIDTH_MAP}),
        chardata.SINGLE_QUOTE_RE.pattern,
        chardata.DOUBLE_QUOTE_RE.pattern,
    ]
    return std_re.compile("|".join(untranslatable + translatable)), std_re.compile("|".join(untranslatable))


def _fixed_char_spans(op: Any, arg: Any, codes: Any) -> list[tuple[int, int]] | None:
    """Code point ranges one parsed regex element must match, if it is a plain set."""
    if op is codes.LITERAL:
        return [(arg, arg)]
    if op is not codes.IN:
        return None
    spans = []
    for item_op, item_arg in arg:
        if item_op is codes.LITERAL:
            spans.append((item_arg, item_arg))
        elif item_op is codes.RANGE:
            spans.append(item_arg)
        else:  # negation, \s, \w ...: not a fixed set
            return None
    return spans


def _mojibake_hint_pattern() -> std_re.Pattern[str] | None:
    """Characters without which ftfy's mojibake detector (`is_bad`) cannot match.

    Each alternative of ftfy's BADNESS_RE has positions that must match one of a
    fixed set of non-ASCII characters; the smallest such set of every alternative,
    united, is this class, derived from the live pattern. Text with none of them
    is not bad, so `is_bad`, the main cost of the non-ASCII shortcut, is skipped
    for scripts ftfy does not suspect (CJK, emoji, ...). None if the pattern is not
    of that shape.
    """
    if _FTFY_PATTERNS is None:
        return None
    try:
        from re import _constants as codes
        from re import _parser

        from ftfy.badness import BADNESS_RE

        if BADNESS_RE.flags & std_re.IGNORECASE:
            return None
        tree = list(_parser.parse(BADNESS_RE.pattern, BADNESS_RE.flags))
        if len(tree) != 1 or tree[0][0] is not codes.BRANCH:
            return None
        spans: list[tuple[int, int]] = []
        for alternative in tree[0][1][1]:
            best = None
            for op, arg in alternative:
                found = _fixed_char_spans(op, arg, codes)
                if found and all(lo >= 0x80 for lo, _ in found):
                    size = sum(hi - lo + 1 for lo, hi in found)
                    if best is None or size < best[0]:
                        best = (size, found)
            if best is None:
                return None
            spans += best[1]
    except (ImportError, AttributeError, TypeError, ValueError, IndexError):
        return None
    listed = "".join(f"{std_re.escape(chr(lo))}-{std_re.escape(chr(hi))}" for lo, hi in sorted(set(spans)))
    return std_re.compile(f"[{listed}]")


_FTFY_PATTERNS = _ftfy_patterns()
_MOJIBAKE_HINT = _mojibake_hint_pattern()
_FTFY_SEGMENT_LENGTH = 1_000_000


def _looks_bad(text: str) -> bool:
    """ftfy's `is_bad`, skipped when the text lacks every character it could match on."""
    if _MOJIBAKE_HINT is not None and _MOJIBAKE_HINT.search(text) is None:
        return False
    return is_bad(text)


def _settled(text: str) -> bool:
    """ftfy's loop would return `text` as it is: no fixer applies, NFC holds, no mojibake."""
    return (
        _FTFY_PATTERNS[0].search(text) is None
        and unicodedata.is_normalized("NFC", text)
        and not _looks_bad(text)
    )


def _simple_ftfy(text: str) -> str | None:
    """ftfy.fix_text + html.unescape of one-segment non-ASCII `text`, when provably simple.

    Simple means ftfy's loop settles after one pass in which at most its three
    character-translating fixers (ligatures, character width, curly quotes) act, as
    they do on "it’s" or "ＬＯＵＤ": the mojibake detector passes the text before and
    after, nothing else applies, and the result is settled. None otherwise.
    """
    if _FTFY_PATTERNS is None or len(text) > _FTFY_SEGMENT_LENGTH:
        return None
    any_fix, untranslatable = _FTFY_PATTERNS
    if any_fix.search(text) is None:
        return text if unicodedata.is_normalized("NFC", text) and not _looks_bad(text) else None
    if untranslatable.search(text) is not None or _looks_bad(text):
        return None
    # Same fixers, same order as ftfy's pass (fix_encoding is a no-op: is_bad is False).
    from ftfy import fixes

    fixed = fixes.uncurl_quotes(fixes.fix_character_width(fixes.fix_latin_ligatures(text)))
    return fixed if _settled(fixed) else None


def _reference_clean(text: str) -> str:
    """The reference's cleaning: ftfy, HTML unescaping (twice), whitespace collapse, lower case."""
    text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
    return " ".join(text.split()).strip().lower()


def _clean_words(text: str) -> list[str]:
    """Cleaned text cut at spaces (see the module docstring for the ASCII shortcut)."""
    if _NEEDS_FULL_CLEAN.search(text) is None:
        return text.lower().split()
    fixed = _simple_ftfy(text)
    if fixed is not None:
        # As the reference: collapse whitespace, then lower-case (which can change length).
        return " ".join(fixed.split()).lower().split(" ")
    return _reference_clean(text).split(" ")


class SimpleTokenizer:
    """CLIP's BPE tokenizer: `encode`/`decode` between text and vocabulary ids.

    `encode` returns the ids of the cleaned text without start/end tokens, as the
    reference does; `decode` is the reference's byte-level inverse (special tokens
    come out as their names). For fixed-length model input use `tokenize` or
    `tokenize_np`.
    """

    def __init__(self, bpe_path: str | Path = VOCAB_PATH) -> None:
        with gzip.open(bpe_path, "rt", encoding="utf-8") as f:
            lines = f.read().split("\n")
        # Line 0 is a version header.
        merges = [tuple(line.split()) for line in lines[1 : _NUM_MERGES + 1]]
        byte_chars, self._byte_char = _byte_symbols()
        vocab = byte_chars + [c + _END_OF_WORD for c in byte_chars]
        vocab += ["".join(m) for m in merges] + list(_SPECIAL_TOKENS)
        # Built like the reference (later duplicates win) so that ids agree even if
        # two merges spell the same string.
        self.encoder: dict[str, int] = dict(zip(vocab, range(len(vocab))))
        self.decoder: dict[int, str] = dict(enumerate(vocab))
        self._ranks: dict[tuple[str, ...], int] = dict(zip(merges, range(len(merges))))
        self._unranked = len(merges)
        self._byte_of = {c: b for b, c in enumerate(self._byte_char)}
        # UTF-8 bytes, seen as Latin-1 code points, translated to BPE symbols.
        self._to_symbols = {b: c for b, c in enumerate(self._byte_char)}
        self.sot_token_id = self.encoder[_SPECIAL_TOKENS[0]]
        self.eot_token_id = self.encoder[_SPECIAL_TOKENS[1]]
        self.vocab_size = len(vocab)
        self._special_ids = {t: self.encoder[t] for t in _SPECIAL_TOKENS}
        self._pattern = regex.compile(
            "|".join(_SPECIAL_TOKENS) + r"""|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+""",
            regex.IGNORECASE,
        )
        self._piece_cache: dict[str, tuple[int, ...]] = {}
        # Pre-tokens -> ids. Seeded with the special tokens, which must never be merged.
        self._special_cache = {t: (i,) for t, i in self._special_ids.items()}
        self._token_cache: dict[str, tuple[int, ...]] = dict(self._special_cache)

    # -- BPE ---------------------------------------------------------------
    def _merge(self, symbols: str) -> list[str]:
        """Apply the merges to one pre-token, lowest rank first, until none applies."""
        parts = list(symbols)
        parts[-1] += _END_OF_WORD
        rank_of = self._ranks.get
        unranked = self._unranked
        while len(parts) > 1:
            pair_ranks = [rank_of(pair, unranked) for pair in zip(parts, parts[1:])]
            best = min(pair_ranks)
            if best == unranked:
                break
            # A rank names one pair, so equal ranks mark every occurrence of the best
            # pair; they are joined left to right without overlap ("aaa" -> "aa", "a").
            i = pair_ranks.index(best)
            joined = parts[i] + parts[i + 1]
            merged = parts[:i]
            merged.append(joined)
            i += 2
            last = len(parts) - 1
            while i <= last:
                if i < last and pair_ranks[i] == best:
                    merged.append(joined)
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        return parts

    def _piece_ids(self, piece: str) -> tuple[int, ...]:
        """Ids of a space-free stretch of cleaned text."""
        ids: list[int] = []
        token_cache = self._token_cache
        # An ASCII word is one pre-token (a run of letters); skip the splitting regex.
        tokens = [piece] if piece.isascii() and piece.isalpha() else self._pattern.findall(piece)
        for token in tokens:
            found = token_cache.get(token)
            if found is None:
                symbols = token.encode("utf-8").decode("latin-1").translate(self._to_symbols)
                found = tuple(self.encoder[s] for s in self._merge(symbols))
                if len(token_cache) >= _CACHE_LIMIT:
                    token_cache.clear()
                    token_cache.update(self._special_cache)
                token_cache[token] = found
            ids.extend(found)
        return tuple(ids)

    def _cached_piece_ids(self, piece: str) -> tuple[int, ...]:
        found = self._piece_ids(piece)
        if len(self._piece_cache) >= _CACHE_LIMIT:
            self._piece_cache.clear()
        self._piece_cache[piece] = found
        return found

    def _ids_of_words(self, words: list[str], limit: int | None) -> list[int]:
        """Ids of the space-separated pieces of cleaned text, at most `limit` of them."""
        # A plain loop: measured faster than list-comprehension variants on captions.
        lookup = self._piece_cache.get
        ids: list[int] = []
        for word in words:
            found = lookup(word)
            if found is None:
                found = self._cached_piece_ids(word)
            ids += found
            if limit is not None and len(ids) >= limit:
                del ids[limit:]
                break
        return ids

    # -- public ------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Vocabulary ids of `text` after CLIP's cleaning, without start/end tokens."""
        _check_text(text, "text")
        return self._ids_of_words(_clean_words(text), None)

    def decode(self, tokens: Iterable[int]) -> str:
        """Text of `tokens`, byte-level; end-of-word marks become spaces, as in the reference."""
        try:
            symbols = "".join(self.decoder[int(t)] for t in tokens)
        except KeyError as e:
            raise ValueError(f"token id {e.args[0]} is not in the vocabulary (0..{self.vocab_size - 1})") from None
        # Special tokens' names are plain ASCII, which maps to itself.
        data = bytes(self._byte_of[c] for c in symbols)
        return data.decode("utf-8", errors="replace").replace(_END_OF_WORD, " ")

    def tokenize_np(self, texts: str | Iterable[str], context_length: int = CONTEXT_LENGTH) -> np.ndarray:
        """int64 array [N, context_length]: start, ids, end, zero padding; see `tokenize_np`."""
        batch = _as_batch(texts)
        context_length = _check_context_length(context_length)
        out = np.zeros((len(batch), context_length), dtype=np.int64)
        if context_length == 1:
            # The reference keeps the first token and overwrites it with the end token.
            _check_texts(batch)
            out[:, 0] = self.eot_token_id
            return out
        keep = context_length - 2
        sot, eot = self.sot_token_id, self.eot_token_id
        for row, text in enumerate(batch):
            if type(text) is not str:
                _check_text(text, f"texts[{row}]")
            ids = self._ids_of_words(_clean_words(text), keep)
            ids.insert(0, sot)
            ids.append(eot)
            # Measured: a slice assignment per row beats one masked scatter per batch.
            out[row, : len(ids)] = ids
        return out

    def __call__(self, texts: str | Iterable[str], context_length: int = CONTEXT_LENGTH) -> torch.Tensor:
        import torch

        return torch.from_numpy(self.tokenize_np(texts, context_length))


def _check_text(text: Any, name: str) -> None:
    if not isinstance(text, str):
        hint = " (decode bytes to str first)" if isinstance(text, (bytes, bytearray)) else ""
        raise TypeError(f"{name} must be str, got {type(text).__name__}{hint}")


def _check_texts(batch: list[Any]) -> None:
    for row, text in enumerate(batch):
        _check_text(text, f"texts[{row}]")


def _as_batch(texts: Any) -> list[Any]:
    if isinstance(texts, str):
        return [texts]
    if type(texts) is list:  # the common case, without the slower ABC check below
        return texts
    if isinstance(texts, (bytes, bytearray)) or not isinstance(texts, Iterable):
        raise TypeError(f"texts must be a str or a sequence of str, got {type(texts).__name__}")
    return list(texts)


def _check_context_length(context_length: Any) -> int:
    if type(context_length) is int and context_length > 0:
        return context_length
    if context_length is None:  # as the reference: None means the default
        return CONTEXT_LENGTH
    if isinstance(context_length, bool) or not isinstance(context_length, (int, np.integer)):
        raise TypeError(f"context_length must be an int, got {type(context_length).__name__}")
    if context_length < 1:
        raise ValueError(f"context_length must be at least 1, got {context_length}")
    return int(context_length)


@lru_cache(maxsize=1)
def _default_tokenizer() -> SimpleTokenizer:
    return SimpleTokenizer()


def tokenize_np(texts: str | Iterable[str], context_length: int = CONTEXT_LENGTH) -> np.ndarray:
    """CLIP token ids as a numpy int64 array [N, context_length] (a str gives N=1).

    Each row is the start token 49406, the text's ids, the end token 49407 and
    zero padding. Texts longer than the context keep their first
    `context_length - 1` tokens with the last replaced by the end token, as in
    CLIP. Values equal `tokenize`; this variant does not import torch, for data
    workers. Raises TypeError for non-str input.
    """
    return _default_tokenizer().tokenize_np(texts, context_length)


def tokenize(texts: str | Iterable[str], context_length: int = CONTEXT_LENGTH) -> torch.Tensor:
    """CLIP token ids as a torch.LongTensor [N, context_length]; see `tokenize_np`."""
    import torch

    return torch.from_numpy(tokenize_np(texts, context_length))


def decode(ids: Any) -> str:
    """Text of one row of token ids (list, numpy array or tensor).

    Skips the start token, stops at the first end token (so padding is ignored)
    and trims the space the last end-of-word mark leaves.
    """
    if hasattr(ids, "detach"):
        ids = ids.detach().cpu().numpy()
    row = np.asarray(ids)
    if row.ndim == 2 and row.shape[0] == 1:
        row = row[0]
    if row.ndim != 1:
        raise ValueError(f"decode() takes one row of ids, got shape {tuple(row.shape)}; decode rows one by one")
    if row.size and not np.issubdtype(row.dtype, np.integer):
        if not np.all(np.equal(np.mod(row, 1), 0)):
            raise ValueError("decode() takes integer token ids")
        row = row.astype(np.int64)
    tok = _default_tokenizer()
    kept: list[int] = []
    for t in row.tolist():
        if t == tok.eot_token_id:
            break
        if t != tok.sot_token_id:
            kept.append(t)
    return tok.decode(kept).strip()
