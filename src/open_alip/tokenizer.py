"""The CLIP byte-pair-encoding tokenizer, id-for-id equal to the reference one.

RWKV-CLIP, ALIP and open_clip all feed their text towers with OpenAI CLIP's BPE
tokenizer. Token ids end up inside training records, so "close enough" is not good
enough: `tokenize` must give exactly the ids of open_clip's `tokenize` (same
ftfy version) for every input, however broken. The equivalence test in
tests/open_alip/test_tokenizer.py checks that against the real open_clip on a large corpus.

What makes it faster than the reference, without changing a single id:

* Printable ASCII (plus tab/LF/CR/form feed) with no '&' that could start an
  entity skips text cleaning altogether: nothing to unescape, no mojibake, no
  control character, ligature, wide form or curly quote, NFC does not touch
  ASCII, and the line-break fix only swaps one whitespace for another, which the
  whitespace collapse erases.
* So does other one-segment NFC text without a possible entity, a character
  some ftfy fixer acts on or a character ftfy's mojibake detector can match on
  (CJK, emoji, most scripts): ftfy and html.unescape return it as it is.
* Everything else goes through `_fix_text`, ftfy 6.3.1's `fix_text` restated:
  the same segments, the same steps in the same order, ftfy's own functions,
  but each step skipped when it provably returns its input, which a cheap check
  shows: no '&' (entities), no character the fixer acts on (from ftfy's own
  tables and patterns), no match of ftfy's mojibake detector (its pattern rebuilt
  so that the regex engine skips to the few characters it can match on,
  `_fast_badness_pattern`). Real mojibake still goes through ftfy's own repair
  step. With any other ftfy version `ftfy.fix_text` itself runs.
* No match of the splitting pattern can contain a space, so the cleaned text can
  be cut at whitespace and each piece's ids cached: captions are built from a
  small vocabulary of words, so most pieces are a dictionary hit.
* BPE of a new word runs on vocabulary ids and looks up only the pair ranks a
  join changes (`_bpe`).
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
from ftfy.badness import BADNESS_RE

from .constants import CONTEXT_LENGTH

if TYPE_CHECKING:
    import torch

VOCAB_PATH = Path(__file__).with_name("bpe_simple_vocab_16e6.txt.gz")

# The merge list has more lines than CLIP uses; CLIP's vocabulary is 256 bytes,
# their 256 end-of-word forms, these merges and the 2 special tokens: 49408 ids.
_NUM_MERGES = 49152 - 256 - 2
_SPECIAL_TOKENS = ("<start_of_text>", "<end_of_text>")
_END_OF_WORD = "</w>"
# More than any id: pair keys a * _PAIR + b are distinct for distinct pairs.
_PAIR = 1 << 16

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


def _char_class(codes: Iterable[int]) -> str:
    """A regex class of exactly these code points."""
    spans: list[list[int]] = []
    for code in sorted(set(codes)):
        if spans and spans[-1][1] == code - 1:
            spans[-1][1] = code
        else:
            spans.append([code, code])
    return "[" + "".join(f"{std_re.escape(chr(lo))}-{std_re.escape(chr(hi))}" for lo, hi in spans) + "]"


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


def _class_codes(pattern: std_re.Pattern[str]) -> set[int]:
    """The code points a one-character-class pattern such as ftfy's `[\\x80-\\x9f]` matches."""
    from re import _constants as codes
    from re import _parser

    items = list(_parser.parse(pattern.pattern, pattern.flags))
    spans = _fixed_char_spans(*items[0], codes) if len(items) == 1 else None
    if spans is None or pattern.flags & std_re.IGNORECASE:
        raise ValueError(f"not a plain character class: {pattern.pattern!r}")
    return {code for lo, hi in spans for code in range(lo, hi + 1)}


# The fast ftfy path restates ftfy 6.3.1's control flow and calls its internals;
# any other version gets ftfy itself.
_FAST_FTFY = ftfy.__version__ == "6.3.1" and hasattr(ftfy, "_fix_encoding_one_step_and_explain")


def _character_fixers() -> tuple[tuple[set[int], Any], ...] | None:
    """ftfy's character fixers in the order its loop runs them, each with the characters it acts on.

    Each fixer returns its input unchanged unless the text holds one of these
    characters: those of the fixer's own pattern (C1 controls, curly quotes,
    surrogates), the keys of its translation table, the characters the line-break
    fix replaces, or ESC, which starts every terminal escape. None without the fast
    ftfy path or if ftfy's patterns are not plain character classes.
    """
    if not _FAST_FTFY:
        return None
    from ftfy import chardata, fixes

    try:
        return (
            (_class_codes(chardata.C1_CONTROL_RE), fixes.fix_c1_controls),
            (set(chardata.LIGATURES), fixes.fix_latin_ligatures),
            (set(chardata.WIDTH_MAP), fixes.fix_character_width),
            (
                _class_codes(chardata.SINGLE_QUOTE_RE) | _class_codes(chardata.DOUBLE_QUOTE_RE),
                fixes.uncurl_quotes,
            ),
            (set(map(ord, "\r\u2028\u2029\x85")), fixes.fix_line_breaks),
            (_class_codes(fixes.SURROGATE_RE), fixes.fix_surrogates),
            ({0x1B}, fixes.remove_terminal_escapes),
            (set(chardata.CONTROL_CHARS), fixes.remove_control_chars),
        )
    except (ImportError, AttributeError, ValueError):
        return None


_FIXER_CODES = _character_fixers()
# Each fixer with a pattern for its characters, and one for any fixer's character.
_CHARACTER_FIXERS = (
    None
    if _FIXER_CODES is None
    else tuple((std_re.compile(_char_class(codes)), fixer) for codes, fixer in _FIXER_CODES)
)
_FIXABLE_CODES: set[int] = set().union(*(codes for codes, _ in _FIXER_CODES or ()))
_FIXABLE = std_re.compile(_char_class(_FIXABLE_CODES)) if _FIXABLE_CODES else None
_unescape_html = ftfy.fixes.unescape_html
# What `ftfy.fix_encoding` repeats, with the settings it passes.
_ENCODING_STEP = getattr(ftfy, "_fix_encoding_one_step_and_explain", None)
_ENCODING_CONFIG = ftfy.TextFixerConfig(explain=False)


def _fixed_sequences(items: list[Any], codes: Any) -> list[list[Any]] | None:
    """The element sequences one regex alternative stands for, with each `x?` spelled out.

    None if the alternative holds anything but single characters, character sets,
    '.', '^' (start of string) and optional single elements: elements that look at
    nothing outside the one character they match, or at the string's start.
    """
    sequences: list[list[Any]] = [[]]
    for op, arg in items:
        if op in (codes.MAX_REPEAT, codes.MIN_REPEAT) and arg[0] == 0 and arg[1] == 1 and len(arg[2]) == 1:
            optional = list(arg[2])
            if optional[0][0] not in (codes.LITERAL, codes.NOT_LITERAL, codes.IN, codes.ANY):
                return None
            sequences = [seq + extra for seq in sequences for extra in ([], optional)]
        elif op in (codes.LITERAL, codes.NOT_LITERAL, codes.IN, codes.ANY) or (
            op is codes.AT and arg is codes.AT_BEGINNING
        ):
            sequences = [[*seq, (op, arg)] for seq in sequences]
        else:
            return None
    return sequences


def _fast_badness_pattern() -> tuple[std_re.Pattern[str], set[int]] | None:
    """ftfy's mojibake detector BADNESS_RE, rebuilt so that a search skips ordinary text.

    BADNESS_RE is a list of alternatives, each a fixed sequence of single-character
    elements (`_fixed_sequences`); in every sequence some element must match one of
    a small fixed set of non-ASCII characters, its hint. A sequence e1..em with hint
    ek matches somewhere exactly when, at some character c in ek's set, e1..ek match
    ending at c (a look-behind; the sequence has a fixed width) and ek+1..em match
    right after it (a look-ahead); '^' still means index 0 inside a look-behind. So
    `[all hints](?:(?<=e1..ek)(?=ek+1..em)|...)` finds a match exactly when
    BADNESS_RE does, and since it starts with one character set, the regex engine
    jumps straight to hint characters: CJK, emoji, plain ASCII cost next to nothing.
    Returns that pattern and all hint characters (text without one is not bad);
    None (BADNESS_RE itself is then used) if the pattern is not of that shape, the
    regex internals differ, or without the fast ftfy path.
    """
    if not _FAST_FTFY:
        return None
    try:
        from re import _compiler, _parser
        from re import _constants as codes

        if BADNESS_RE.flags & (std_re.IGNORECASE | std_re.MULTILINE | std_re.LOCALE):
            return None
        tree = _parser.parse(BADNESS_RE.pattern, BADNESS_RE.flags)
        items = list(tree)
        if len(items) != 1 or items[0][0] is not codes.BRANCH:
            return None
        hints: list[tuple[int, int]] = []
        branch = []
        for alternative in items[0][1][1]:
            sequences = _fixed_sequences(list(alternative), codes)
            if sequences is None:
                return None
            for sequence in sequences:
                sizes = []
                for k, (op, arg) in enumerate(sequence):
                    found = _fixed_char_spans(op, arg, codes)
                    if found and all(lo >= 0x80 for lo, _ in found):
                        sizes.append((sum(hi - lo + 1 for lo, hi in found), k, found))
                if not sizes:
                    return None
                _, k, found = min(sizes)
                hints += found
                checks = [(codes.ASSERT, (-1, _parser.SubPattern(tree.state, sequence[: k + 1])))]
                if k + 1 < len(sequence):
                    checks.append((codes.ASSERT, (1, _parser.SubPattern(tree.state, sequence[k + 1 :]))))
                branch.append(_parser.SubPattern(tree.state, checks))
        spans = sorted(set(hints))
        hint_set = [(codes.RANGE, span) for span in spans]
        rebuilt = _parser.SubPattern(tree.state, [(codes.IN, hint_set), (codes.BRANCH, (None, branch))])
        hint_codes = {code for lo, hi in spans for code in range(lo, hi + 1)}
        return _compiler.compile(rebuilt, BADNESS_RE.flags), hint_codes
    except (ImportError, AttributeError, TypeError, ValueError, IndexError, std_re.error):
        return None


_FAST_BADNESS, _BADNESS_HINTS = _fast_badness_pattern() or (None, set())
# Text without any of these is its own ftfy.fix_text and html.unescape, if it is one
# NFC segment: no '&' to start an entity, not bad, nothing for a character fixer.
_MAYBE_CHANGED = (
    None
    if _FAST_BADNESS is None
    else std_re.compile(_char_class({*_FIXABLE_CODES, *_BADNESS_HINTS, *b"&\n"}))
)
# ftfy's default `max_decode_length`: longer lines are cut into segments of this size.
_FTFY_SEGMENT_LENGTH = 1_000_000


# Finds a match exactly when ftfy's `is_bad` is true (that is `bool(BADNESS_RE.search(text))`).
_bad_match = (_FAST_BADNESS or BADNESS_RE).search


def _looks_bad(text: str) -> bool:
    """ftfy's `is_bad(text)` (see `_fast_badness_pattern`)."""
    return _bad_match(text) is not None


def _fix_encoding(text: str) -> str:
    """`ftfy.fix_encoding(text)`: its mojibake-fixing step, repeated until nothing changes.

    ftfy's step returns text that `is_bad` passes unchanged (its first check), so
    the step runs only on text `_looks_bad` flags. The result is a fixed point:
    `_fix_encoding` returns it unchanged.
    """
    while _bad_match(text) is not None:
        fixed = _ENCODING_STEP(text, _ENCODING_CONFIG).text
        if fixed == text:
            break
        text = fixed
    return text


def _fix_segment(text: str, unescape: bool) -> str:
    """ftfy 6.3.1's `fix_and_explain` loop on one segment, default settings, minus no-op calls.

    Same steps, same order, same functions; a step is skipped only when it provably
    returns its input: entity unescaping needs an '&'; `_fix_encoding` returns its
    own output unchanged; each character fixer needs a character of its pattern.
    `unicodedata.normalize` returns NFC text itself.
    """
    settled = None
    while True:
        before = text
        if unescape and "&" in text:
            text = _unescape_html(text)
        if text != settled:
            text = settled = _fix_encoding(text)
        if _FIXABLE.search(text) is not None:
            for needed, fixer in _CHARACTER_FIXERS:
                if needed.search(text) is not None:
                    text = fixer(text)
        text = unicodedata.normalize("NFC", text)
        if text == before:
            return text


def _fix_text(text: str) -> str:
    """`ftfy.fix_text(text)` with default settings, faster (see `_fix_segment`).

    As ftfy: the text is fixed in segments, each line (with its line feed) or, for a
    longer line, each `_FTFY_SEGMENT_LENGTH` characters of it; HTML entities are
    unescaped until the first segment holding a '<', and not from there on.
    """
    if _CHARACTER_FIXERS is None:
        return ftfy.fix_text(text)
    if len(text) <= _FTFY_SEGMENT_LENGTH and "\n" not in text:
        return _fix_segment(text, "<" not in text)
    out = []
    unescape = True
    pos = 0
    while pos < len(text):
        end = min(text.find("\n", pos) + 1 or len(text), pos + _FTFY_SEGMENT_LENGTH)
        segment = text[pos:end]
        unescape = unescape and "<" not in segment
        out.append(_fix_segment(segment, unescape))
        pos = end
    return "".join(out)


def _reference_clean(text: str) -> str:
    """The reference's cleaning: ftfy, HTML unescaping (twice), whitespace collapse, lower case."""
    text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
    return " ".join(text.split()).strip().lower()


def _clean_words(text: str) -> list[str]:
    """The reference's cleaning of `text`, cut at whitespace.

    Printable ASCII without a possible entity skips ftfy and HTML unescaping (see
    the module docstring), so does one NFC segment that `_MAYBE_CHANGED` finds
    nothing in; everything else takes `_fix_text`, equal to ftfy. html.unescape
    returns text without '&' as it is.

    The reference collapses whitespace, then lower-cases and cuts at spaces; here
    the text is lower-cased, then cut at whitespace. Same words: lower-casing maps
    no character to or from whitespace, and whitespace is neither cased nor
    case-ignorable, so it ends the context scan of a final sigma just as a single
    space or the text's end does (tests/open_alip/test_tokenizer.py checks every character).
    """
    if _NEEDS_FULL_CLEAN.search(text) is None:
        return text.lower().split()
    if (
        _MAYBE_CHANGED is not None
        and _MAYBE_CHANGED.search(text) is None
        and len(text) <= _FTFY_SEGMENT_LENGTH
        and unicodedata.is_normalized("NFC", text)
    ):
        return text.lower().split()
    text = _fix_text(text)
    if "&" in text:
        text = html.unescape(html.unescape(text))
    return text.lower().split()


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
        self._byte_of = {c: b for b, c in enumerate(self._byte_char)}
        # BPE runs on ids: each symbol the reference would hold as a string is held as
        # that string's id (distinct strings, distinct ids), a pair (a, b) as a * _PAIR + b.
        # Every symbol is a vocabulary string: a byte's, a last byte's with its
        # end-of-word mark, or the join of a merge; a merge whose halves are not in
        # the vocabulary can never apply. Later duplicates win, as in the reference.
        encoder = self.encoder
        self._first_id = [encoder[c] for c in self._byte_char]
        self._last_id = [encoder[c + _END_OF_WORD] for c in self._byte_char]
        self._pair_rank: dict[int, int] = {}
        for rank, merge in enumerate(merges):
            if len(merge) == 2 and merge[0] in encoder and merge[1] in encoder:
                self._pair_rank[encoder[merge[0]] * _PAIR + encoder[merge[1]]] = rank
        self._joined_id = [encoder["".join(merge)] for merge in merges]
        self._unranked = len(merges)
        self.sot_token_id = self.encoder[_SPECIAL_TOKENS[0]]
        self.eot_token_id = self.encoder[_SPECIAL_TOKENS[1]]
        self.vocab_size = len(vocab)
        self._special_ids = {t: self.encoder[t] for t in _SPECIAL_TOKENS}
        self._pattern = regex.compile(
            "|".join(_SPECIAL_TOKENS) + r"""|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+""",
            regex.IGNORECASE,
        )
        # The same pattern for ASCII text, where letters are A-Z and a-z, numbers 0-9 and
        # whitespace the same six characters, in the standard re module, which is faster.
        self._ascii_pattern = std_re.compile(
            "|".join(_SPECIAL_TOKENS) + r"""|'s|'t|'re|'ve|'m|'ll|'d|[a-z]+|[0-9]|[^\s0-9a-z]+""",
            std_re.IGNORECASE | std_re.ASCII,
        )
        self._piece_cache: dict[str, tuple[int, ...]] = {}
        # Pre-tokens -> ids. Seeded with the special tokens, which must never be merged.
        self._special_cache = {t: (i,) for t, i in self._special_ids.items()}
        self._token_cache: dict[str, tuple[int, ...]] = dict(self._special_cache)

    # -- BPE ---------------------------------------------------------------
    def _bpe(self, token: str) -> tuple[int, ...]:
        """Ids of one pre-token: its UTF-8 bytes, merged lowest rank first until none applies.

        As the reference, each round joins every occurrence of the lowest-ranked
        pair, left to right without overlap ("aaa" -> "aa", "a"). A rank names one
        pair, so equal ranks mark its occurrences. Only the ranks next to a join
        change, so they are the only ones looked up again; a pair holding the joined
        symbol can never be the pair being joined, so a round finds no new
        occurrences of its own pair.
        """
        data = token.encode("utf-8")
        first = self._first_id
        ids = [first[byte] for byte in data]
        ids[-1] = self._last_id[data[-1]]
        rank_of = self._pair_rank.get
        unranked = self._unranked
        ranks = [rank_of(a * _PAIR + b, unranked) for a, b in zip(ids, ids[1:])]
        while ranks:
            best = min(ranks)
            if best == unranked:
                break
            joined = self._joined_id[best]
            i = ranks.index(best)
            while True:
                ids[i] = joined
                del ids[i + 1]
                del ranks[i]
                if i:
                    ranks[i - 1] = rank_of(ids[i - 1] * _PAIR + joined, unranked)
                if i < len(ranks):
                    ranks[i] = rank_of(joined * _PAIR + ids[i + 1], unranked)
                    try:
                        i = ranks.index(best, i + 1)
                    except ValueError:
                        break
                else:
                    break
        return tuple(ids)

    def _piece_ids(self, piece: str) -> tuple[int, ...]:
        """Ids of a space-free stretch of cleaned text."""
        ids: list[int] = []
        token_cache = self._token_cache
        if piece.isascii():
            # An ASCII word is one pre-token (a run of letters); skip the splitting regex.
            tokens = [piece] if piece.isalpha() else self._ascii_pattern.findall(piece)
        else:
            tokens = self._pattern.findall(piece)
        for token in tokens:
            found = token_cache.get(token)
            if found is None:
                found = self._bpe(token)
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
            raise ValueError(
                f"token id {e.args[0]} is not in the vocabulary (0..{self.vocab_size - 1})"
            ) from None
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
        raise ValueError(
            f"decode() takes one row of ids, got shape {tuple(row.shape)}; decode rows one by one"
        )
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
