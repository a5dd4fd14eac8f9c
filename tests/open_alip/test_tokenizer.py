"""The CLIP tokenizer must give open_clip's ids on any text, and fail clearly on non-text.

The reference is the real open_clip tokenizer (with ftfy 6.3.1) in an isolated venv,
see benchmarks/oracles.py. Corpora come from benchmarks/corpora.py, deterministically.
"""

import subprocess
import sys

import ftfy
import numpy as np
import pytest
import torch
from ftfy.badness import is_bad
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.corpora import FRAGMENTS, caption_corpus, junk_corpus, long_texts, web_caption_corpus
from benchmarks.oracles import REPO_ROOT, ReferenceTokenizer, reference_python
from src.open_alip import tokenizer as tok_mod
from src.open_alip.constants import EOT_TOKEN, SOT_TOKEN
from src.open_alip.tokenizer import (
    SimpleTokenizer,
    decode,
    tokenize,
    tokenize_np,
)

HYPOTHESIS = settings(
    max_examples=200,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def reference():
    ref = ReferenceTokenizer(reference_python())
    yield ref
    ref.close()


def _reference_ids(reference: ReferenceTokenizer, texts: list[str], context_length: int = 77) -> np.ndarray:
    ids = reference.tokenize(texts, context_length)
    return np.array(ids, dtype=np.int64).reshape(len(texts), context_length)


def _assert_same(
    reference: ReferenceTokenizer,
    texts: list[str],
    context_length: int = 77,
    expected: np.ndarray | None = None,
) -> None:
    if expected is None:
        expected = _reference_ids(reference, texts, context_length)
    got = tokenize_np(texts, context_length)
    bad = np.flatnonzero((got != expected).any(axis=1))
    detail = [(texts[i][:80], got[i][:12].tolist(), expected[i][:12].tolist()) for i in bad[:5]]
    assert bad.size == 0, f"{bad.size} of {len(texts)} texts differ from the reference, e.g. {detail}"


# -- equivalence with the reference --------------------------------------------------------


def test_matches_reference_on_generated_corpus(reference):
    texts = caption_corpus(6000, seed=1) + junk_corpus(12000, seed=2) + web_caption_corpus(5000, seed=16)
    texts += long_texts(seed=3)
    expected = _reference_ids(reference, texts)
    _assert_same(reference, texts, expected=expected)
    # A second pass hits the caches everywhere; it must not change anything.
    _assert_same(reference, texts, expected=expected)


@pytest.mark.parametrize("context_length", [1, 2, 3, 8, 77, 300])
def test_matches_reference_at_any_context_length(reference, context_length):
    texts = caption_corpus(300, seed=4) + junk_corpus(300, seed=5) + web_caption_corpus(300, seed=17)
    texts += long_texts(seed=6)[:3]
    _assert_same(reference, texts, context_length)


@HYPOTHESIS
@given(st.lists(st.text(alphabet=st.characters(exclude_categories=())), max_size=20))
def test_matches_reference_on_any_unicode(reference, texts):
    _assert_same(reference, texts)


@HYPOTHESIS
@given(st.lists(st.lists(st.sampled_from(FRAGMENTS), max_size=15).map("".join), max_size=20))
def test_matches_reference_on_glued_fragments(reference, texts):
    _assert_same(reference, texts)


@HYPOTHESIS
@given(st.lists(st.text(alphabet=st.characters(max_codepoint=0xFF), max_size=60), max_size=20))
def test_matches_reference_near_the_ascii_shortcut(reference, texts):
    # Latin-1 and ASCII controls sit right at the border of the no-ftfy shortcut.
    _assert_same(reference, texts)


@HYPOTHESIS
@given(st.lists(st.text(alphabet="aabeéř'", min_size=1, max_size=30), min_size=1, max_size=20).map(" ".join))
def test_matches_reference_on_repetitive_words(reference, text):
    # Few letters, long words: BPE joins overlapping pairs ("aaaa") and rejoins joined symbols.
    _assert_same(reference, [text, text.upper()])


def test_ascii_splitting_pattern_equals_the_unicode_one():
    ours = SimpleTokenizer()
    ascii_chars = [chr(c) for c in range(128)]
    texts = [a + b for a in ascii_chars for b in ascii_chars]
    texts += [
        "<start_of_text>x",
        "<END_of_text>",
        "it's",
        "IT'S",
        "we'll'd",
        "a1b22c",
        "http://x.org/a?b=1&c=2",
    ]
    texts += [t for t in junk_corpus(3000, seed=19) if t.isascii()]
    for text in texts:
        assert ours._ascii_pattern.findall(text) == ours._pattern.findall(text), repr(text)


@settings(max_examples=500, derandomize=True, database=None, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=0x7F), max_size=30))
def test_ascii_splitting_pattern_on_any_ascii(text):
    ours = tok_mod._default_tokenizer()
    assert ours._ascii_pattern.findall(text) == ours._pattern.findall(text)


def test_encode_and_decode_match_reference(reference):
    texts = caption_corpus(200, seed=7) + junk_corpus(400, seed=8) + web_caption_corpus(400, seed=18)
    ours = SimpleTokenizer()
    assert [ours.encode(t) for t in texts] == reference.encode(texts)
    rows = [ours.encode(t) for t in texts] + [[SOT_TOKEN, 320, 1125, EOT_TOKEN, 0, 0], [0, 255, 49405]]
    assert [ours.decode(r) for r in rows] == reference.decode(rows)


# -- the cleaning shortcuts, checked against ftfy itself -------------------------------------
# _fix_text restates ftfy.fix_text and _looks_bad restates ftfy's is_bad; _reference_clean is
# the reference's cleaning (ftfy + html.unescape). The equivalence tests above check the whole
# tokenizer against open_clip; these pin the shortcuts to ftfy directly, with many more
# examples, because they are the one place where ids could silently drift.


def _shortcut_agrees(text: str) -> None:
    assert tok_mod._fix_text(text) == ftfy.fix_text(text), repr(text)
    assert " ".join(tok_mod._clean_words(text)) == tok_mod._reference_clean(text), repr(text)


def test_fast_paths_are_in_use():
    # Otherwise every test below would pass against ftfy's own slow path.
    assert tok_mod._FAST_FTFY and tok_mod._CHARACTER_FIXERS is not None and tok_mod._FAST_BADNESS is not None


def test_ascii_shortcut_admits_exactly_the_documented_characters():
    admitted = {chr(c) for c in range(128) if tok_mod._NEEDS_FULL_CLEAN.search(f"a{chr(c)} b") is None}
    assert admitted == set("\t\n\f\r&") | {chr(c) for c in range(0x20, 0x7F)}
    for text in ["Tom & Jerry", "a &", "&", "&\tb"]:
        assert tok_mod._NEEDS_FULL_CLEAN.search(text) is None, text
    for text in ["&amp;", "&amp", "a&b", "&#39;", "&&", "&\rx", "&;"]:
        assert tok_mod._NEEDS_FULL_CLEAN.search(text) is not None, text


_ASCII_ALPHABET = "".join(chr(c) for c in range(128))
_NEAR_ASCII = st.lists(st.sampled_from([*_ASCII_ALPHABET, " & ", "&amp;", "&", "&#"]), max_size=60).map(
    "".join
)


@settings(max_examples=400, derandomize=True, database=None, deadline=None)
@given(st.one_of(_NEAR_ASCII, st.text(alphabet=st.characters(max_codepoint=0x7F, exclude_categories=["Cc"]))))
def test_ascii_shortcut_equals_full_cleaning(text):
    _shortcut_agrees(text)


# What ftfy's steps act on, mixed with mojibake, entity and segment material.
_FTFY_MATERIAL = list(
    "‘’“”ʼ‚ﬁﬂＡａ＆；＃ｶﾞ\u3000é\u0301Ãâ€™Â\xa0\x85\x93\x1b[m\x00\u200b\ufeff\r\n\u2028a &;#<"
)


@settings(max_examples=1500, derandomize=True, database=None, deadline=None)
@given(
    st.one_of(
        st.text(alphabet=st.characters(exclude_categories=()), max_size=40),
        st.text(alphabet=st.characters(max_codepoint=0x3FF), max_size=40),
        st.text(alphabet=st.characters(max_codepoint=0x2BFF, exclude_categories=["Cs"]), max_size=40),
        st.lists(st.sampled_from(FRAGMENTS), max_size=10).map(" ".join),
        st.lists(st.sampled_from(FRAGMENTS), max_size=10).map("".join),
        st.text(alphabet=st.sampled_from(_FTFY_MATERIAL), max_size=30),
    )
)
def test_fast_ftfy_equals_ftfy(text):
    _shortcut_agrees(text)


def test_fast_ftfy_on_web_captions():
    for text in web_caption_corpus(3000, seed=13) + junk_corpus(3000, seed=14) + long_texts(seed=15):
        _shortcut_agrees(text)


# Large blocks of one kind (CJK ideographs, Hangul syllables, private use, ...): every 16th.
_HOMOGENEOUS_BLOCKS = [
    (0x3400, 0x4DBF),
    (0x4E00, 0x9FFF),
    (0xA000, 0xA48C),
    (0xAC00, 0xD7A3),
    (0xE000, 0xF8FF),
]


def test_fast_ftfy_on_every_bmp_character():
    # Each character between letters, next to an accented letter (ftfy's mojibake
    # detector looks at neighbours), doubled, and after mojibake.
    for code in range(0x80, 0x10000):
        if any(lo < code < hi and code % 16 for lo, hi in _HOMOGENEOUS_BLOCKS):
            continue
        char = chr(code)
        text = f"a{char}b é{char}{char} Ã{char}"
        assert tok_mod._fix_text(text) == ftfy.fix_text(text), repr(text)


@settings(max_examples=300, derandomize=True, database=None, deadline=None)
@given(
    st.lists(st.sampled_from([*"ab\n<&;amp#x’", "&amp;", "Ã©", "\r\n"]), max_size=30).map("".join),
    st.integers(min_value=1, max_value=6),
)
def test_fast_ftfy_cuts_segments_as_ftfy(text, length):
    # Short segments make ftfy's cutting of long lines (1,000,000 characters by default) testable.
    saved = tok_mod._FTFY_SEGMENT_LENGTH
    tok_mod._FTFY_SEGMENT_LENGTH = length
    try:
        assert tok_mod._fix_text(text) == ftfy.fix_text(text, max_decode_length=length), repr(text)
    finally:
        tok_mod._FTFY_SEGMENT_LENGTH = saved


def test_each_character_fixer_ignores_text_without_its_characters():
    # The skip in _fix_segment: a fixer whose pattern finds nothing returns its input.
    everything = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
    surrogates = "".join(chr(c) for c in range(0xD800, 0xE000))
    for needed, fixer in tok_mod._CHARACTER_FIXERS:
        for text in (everything, surrogates, "\x1b[31mred\x1b[0m", "a\r\nb\rc"):
            rest = needed.sub("", text)
            assert fixer(rest) == rest, fixer.__name__
    # The patterns match exactly their code points; _FIXABLE is their union.
    for (codes, _), (needed, _) in zip(tok_mod._FIXER_CODES, tok_mod._CHARACTER_FIXERS):
        assert {ord(c) for c in needed.findall(everything + surrogates)} == codes
    assert {ord(c) for c in tok_mod._FIXABLE.findall(everything + surrogates)} == tok_mod._FIXABLE_CODES
    assert tok_mod._FIXABLE_CODES == set().union(*(codes for codes, _ in tok_mod._FIXER_CODES))


@settings(max_examples=1500, derandomize=True, database=None, deadline=None)
@given(
    st.one_of(
        st.text(alphabet=st.characters(max_codepoint=0x24FF, exclude_categories=["Cs"]), max_size=12),
        st.text(alphabet=st.characters(max_codepoint=0x4FF), max_size=30),
        st.lists(st.sampled_from(FRAGMENTS), max_size=6).map("".join),
        st.text(alphabet=st.sampled_from(list("ÃÂâ€™ØÙВГРСΒΓΞΟœŒ°²³×√≈‚Äàµ ¡\xa0\n\tax.,?!")), max_size=12),
    )
)
def test_fast_mojibake_detector_equals_is_bad(text):
    assert tok_mod._looks_bad(text) == is_bad(text), repr(text)


def test_fast_mojibake_detector_on_corpora():
    texts = (
        junk_corpus(4000, seed=11)
        + web_caption_corpus(4000, seed=12)
        + caption_corpus(1000, seed=12, intl_fraction=1.0)
    )
    bad = [t for t in texts if is_bad(t)]
    assert len(bad) > 500  # mojibake is in the corpus, so the check is not vacuous
    assert [t for t in texts if tok_mod._looks_bad(t)] == bad
    # The alternative anchored at the start of the text, and the one with an optional space.
    for text, expected in [("Ã x", True), (" Ã x", False), ("xÃ x", True), ("x\nÃ x", True), ("x Ã x", True)]:
        assert tok_mod._looks_bad(text) is expected is is_bad(text), repr(text)


def test_lower_case_keeps_whitespace_where_it_was():
    # Why _clean_words may lower-case before cutting at whitespace (see its docstring).
    for code in range(0x110000):
        char = chr(code)
        lowered = char.lower()
        if char.isspace():
            assert lowered == char, hex(code)
            # Neither cased nor case-ignorable: it ends a final sigma's context scan.
            assert f"aΣ{char}b".lower() == f"aς{char}b" and f"a{char}Σ".lower() == f"a{char}σ", hex(code)
        else:
            assert lowered and not any(c.isspace() for c in lowered), hex(code)


@settings(max_examples=500, derandomize=True, database=None, deadline=None)
@given(
    st.text(
        alphabet=st.sampled_from(list("aΣσςİI'.\u0301\u00ad\u200d \t\n\x1c\x85\xa0\u2028\u3000")), max_size=20
    )
)
def test_lower_then_cut_equals_collapse_then_lower(text):
    words = text.lower().split()
    assert " ".join(words) == " ".join(text.split()).lower()


@pytest.mark.parametrize(
    "text",
    [
        "a & b",
        "a &amp; b",
        "x \x0b y",
        "\x1b[31mred",
        "a\x7f",
        "é\u0301",
        "e\u0301",
        "ﬁne",
        "ＬＯＵＤ",
        "a\u3000b",
        "\ufeffbom",
        "‘q’",
        "“q”",
        "Ã©",
        "a\x85b",
        "a\u2028b",
        "é\né",
        "\ud800",
        "\x80",
        "Ã é",
        "Â£",
        "it’s",
        "é’",
        "Ã’",
        "＆amp;",
        "’\u0301",
        "ｶﾞ",
        "&amp;lt;b&amp;gt;",
        "<b>&amp;\n&amp;",
        "&amp;\n<b>\n&amp;",
        "Ã\x83Â©",
        "ÃƒÂ©",
        "&Atilde;&copy;",
        "â€œquotedâ€\x9d",
        "x" * 20 + "\r\n" + "Ã©" * 3,
    ],
)
def test_shortcut_edge_cases(text):
    _shortcut_agrees(text)


# -- output shape and values ----------------------------------------------------------------


def test_output_layout():
    out = tokenize("a photo of a cat")
    assert out.dtype == torch.int64 and out.shape == (1, 77)
    assert out[0, :7].tolist() == [SOT_TOKEN, 320, 1125, 539, 320, 2368, EOT_TOKEN]
    assert out[0, 7:].eq(0).all()
    batch = tokenize_np(["a", "b", ""], context_length=5)
    assert batch.dtype == np.int64 and batch.shape == (3, 5)
    assert batch[2].tolist() == [SOT_TOKEN, EOT_TOKEN, 0, 0, 0]
    assert tokenize_np([]).shape == (0, 77)
    assert tokenize_np("a", context_length=None).shape == (1, 77)  # None means the default, as in open_clip
    assert torch.equal(tokenize(["x y", "z"]), torch.from_numpy(tokenize_np(("x y", "z"))))


def test_truncation_keeps_the_start_and_ends_with_the_end_token():
    out = tokenize_np("word " * 500)
    assert out[0, 0] == SOT_TOKEN and out[0, -1] == EOT_TOKEN
    assert (out[0, 1:-1] == tokenize_np("word")[0, 1]).all()


def test_tiny_piece_cache_gives_the_same_ids(monkeypatch):
    texts = caption_corpus(300, seed=9) + junk_corpus(300, seed=10)
    expected = SimpleTokenizer().tokenize_np(texts)
    monkeypatch.setattr(tok_mod, "_CACHE_LIMIT", 4)
    assert np.array_equal(SimpleTokenizer().tokenize_np(texts), expected)


def test_tokenize_np_does_not_import_torch():
    code = (
        "import sys; from src.open_alip import tokenize_np; "
        "assert tokenize_np(['a cat'])[0, 1] == 320; assert 'torch' not in sys.modules, 'torch imported'"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# -- decode ----------------------------------------------------------------------------------


def test_decode_skips_start_and_stops_at_end():
    row = tokenize("A photo of a cat!")[0]
    assert decode(row) == "a photo of a cat !"
    assert decode(row.numpy()) == decode(row.tolist()) == decode(row[None]) == "a photo of a cat !"
    # Float rows are how captions come back out of RecordIO labels.
    assert decode(row.numpy().astype(np.float32)) == "a photo of a cat !"
    assert decode([SOT_TOKEN, 320, 2368, EOT_TOKEN, 320, 320]) == "a cat"
    assert decode([320, 2368]) == "a cat"
    assert decode(tokenize("Café 日本 😀")[0]) == "café 日本 😀"


def test_decode_rejects_bad_ids():
    with pytest.raises(ValueError, match="not in the vocabulary"):
        decode([SOT_TOKEN, 60000])
    with pytest.raises(ValueError, match="one row"):
        decode(np.zeros((2, 77), dtype=np.int64))
    with pytest.raises(ValueError, match="integer"):
        decode([1.5])


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("texts", "message"),
    [
        (None, "texts must be a str or a sequence of str, got NoneType"),
        (123, "got int"),
        (b"caption", "got bytes"),
        (["ok", 3], r"texts\[1\] must be str, got int"),
        (["ok", b"raw"], r"texts\[1\] must be str, got bytes \(decode bytes to str first\)"),
        ([None], r"texts\[0\] must be str, got NoneType"),
    ],
)
def test_non_text_input_raises_type_error(texts, message):
    with pytest.raises(TypeError, match=message):
        tokenize(texts)
    with pytest.raises(TypeError, match=message):
        tokenize_np(texts, context_length=1)


def test_bad_context_length():
    with pytest.raises(ValueError, match="at least 1"):
        tokenize_np("x", context_length=0)
    with pytest.raises(TypeError, match="context_length must be an int"):
        tokenize_np("x", context_length=7.5)
    with pytest.raises(TypeError, match="text must be str"):
        SimpleTokenizer().encode(None)
