"""Deterministic synthetic data shared by benchmarks and tests: caption corpora for the tokenizer,
and tiny learnable RecordIO shards for the trainer.

Nothing is downloaded: captions come from templates and word lists; web captions are
such captions damaged the ways scraped text is (entity-escaped, read in the wrong
encoding, sprinkled with emoji and control characters, wrapped in tags); junk is
hand-picked hostile fragments (entities, mojibake, controls, emoji, scripts) glued
together at random, plus raw random code points. The same seed always gives the
same corpus, so a failure can be replayed.
"""

from __future__ import annotations

import random
from pathlib import Path

_ADJ = [
    "red",
    "old",
    "beautiful",
    "small",
    "Happy",
    "wooden",
    "snowy",
    "sunny",
    "dark",
    "tiny",
    "huge",
    "vintage",
    "colorful",
    "blurry",
    "empty",
    "crowded",
    "ancient",
    "modern",
    "wet",
    "golden",
]
_NOUN = [
    "cat",
    "dog",
    "house",
    "bridge",
    "car",
    "tree",
    "beach",
    "mountain",
    "city",
    "church",
    "flower",
    "bird",
    "boat",
    "train",
    "girl",
    "man",
    "woman",
    "children",
    "street",
    "lake",
    "sunset",
    "castle",
    "market",
    "festival",
    "wedding",
    "garden",
    "museum",
    "horse",
    "bicycle",
    "skyline",
]
_PLACE = [
    "Paris",
    "New York",
    "Tokyo",
    "Berlin",
    "the park",
    "San Francisco",
    "London",
    "the river",
    "Yosemite",
    "Barcelona",
    "the old town",
    "Lake Tahoe",
    "Amsterdam",
    "Kyoto",
    "Sydney",
]
_TEMPLATES = [
    "a photo of a {adj} {noun}.",
    "{adj} {noun} in {place}",
    "A {adj} {noun} next to the {noun2} in {place}, {year}",
    "IMG_{num}",
    "DSC{num}.JPG",
    "{place} {year} - {noun}s and {noun2}s",
    "My {noun} ({year})",
    "{noun2} #{num} @ {place}!!",
    "We're at the {noun}; it's {adj} & {adj2} :)",
    "{place}: the {adj} {noun} I'll never forget...",
    "Photo taken on {month} {day}, {year} by {name}",
    "http://www.flickr.com/photos/{name}/{num}/",
    "{adj} {noun} / {adj2} {noun2} / {place}",
    '"{adj} {noun}" - {name}\'s {noun2}',
]
_MONTH = ["January", "March", "June", "August", "October", "December"]
_NAME = ["john_smith", "Marie", "k.tanaka", "ALEX", "photo-guy", "anna89"]
# Non-ASCII captions as they appear in web data: accents, CJK, emoji.
_INTL = [
    "Café au lait à {place}",
    "Straße in München {year}",
    "niño jugando en la playa",
    "São Paulo à noite",
    "東京タワーの夜景",
    "北京 故宫 {year}",
    "서울의 밤",
    "Москва, Красная площадь",
    "Ελληνικό νησί",
    "{adj} {noun} 😀",
    "I ❤ {place}",
    "{noun} 🐱🐶 #cute",
    "naïve façade — {place}",
    "Zürich – “{noun}”",
    "‘{adj}’ {noun}…",
    "ﬁsh and chips in {place}",
    "{noun} © {name} {year}",
    "½ price {noun}",
]

# Fragments chosen to poke every step of the reference cleaning.
FRAGMENTS = [
    # HTML entities: named, numeric, hex, double-escaped, upper-case, no semicolon, bogus.
    "&amp;",
    "&amp;amp;",
    "&lt;b&gt;",
    "&#39;",
    "&#x27;",
    "&#8217;",
    "&quot;",
    "&nbsp;",
    "&EACUTE;",
    "&Eacute;",
    "&eacute",
    "&not",
    "&notin;",
    "&AMP;",
    "&#0;",
    "&#x110000;",
    "&#xD800;",
    "&bogus;",
    "&#128512;",
    "&hearts;",
    "&Jscr;",
    "&",
    "&&",
    "&#",
    "&#x",
    "P&EACUTE;REZ",
    "this&not that",
    # Tags and '<' (which switches off ftfy's HTML unescaping for the rest of the text).
    "<b>",
    "</i>",
    "<br/>",
    "<",
    ">",
    '<a href="x">',
    # Special-token look-alikes.
    "<start_of_text>",
    "<end_of_text>",
    "<START_OF_TEXT>",
    "<End_Of_Text>",
    "<ſtart_of_text>",
    "<<end_of_text>>",
    "start_of_text",
    # Contractions and case folding edge cases.
    "'s",
    "'S",
    "'ll",
    "'LL",
    "'d",
    "'re",
    "'ve",
    "'m",
    "'t",
    "'ſ",
    "n't",
    "K",
    "İstanbul",
    "ß",
    "ẞ",
    "ǅ",
    "ﬀ",
    "Σ",
    "ς",
    # Mojibake (UTF-8 read as cp1252 / latin-1 / macroman) and things that look like it.
    "Ã©",
    "Ã¨",
    "Ã¢â‚¬â„¢",
    "â€œ",
    "â€\x9d",
    "Ã\xa0",
    "Ã ",
    "Ã¼ber",
    "Ð¿Ñ€Ð¸Ð²ÐµÑ‚",
    "Ã¡",
    "ÃƒÂ©",
    "Ã\x83Â©",
    "â\x80\x99",
    "Ã£Â\x81Â\x82",
    "Â£",
    "Â ",
    "ˆ",
    "√",
    "Ï€",
    "Ã¥Â\xadÂ\x97",
    # Controls: C0, DEL, C1, terminal escapes, BOM, zero-width, bidi, separators.
    "\x00",
    "\x01",
    "\x08",
    "\x0b",
    "\x0c",
    "\x1b",
    "\x1b[31m",
    "\x1b[0m",
    "\x1c",
    "\x1f",
    "\x7f",
    "\x80",
    "\x85",
    "\x93",
    "\x9f",
    "\ufeff",
    "\u200b",
    "\u200d",
    "\u202e",
    "\u2028",
    "\u2029",
    "\u206a",
    "\ufff9",
    "\ufffd",
    "\ufffe",
    # Whitespace of all kinds.
    " ",
    "  ",
    "\t",
    "\n",
    "\r",
    "\r\n",
    "\xa0",
    "\u3000",
    "\u2003",
    "\u202f",
    "\u1680",
    "\u180e",
    # Surrogates, lone and paired.
    "\ud800",
    "\udfff",
    "\ud83d\ude00",
    "\udc00\ud800",
    # Width, ligatures, quotes, combining marks (NFC), compatibility characters.
    "ＬＯＵＤ",
    "ｶﾀｶﾅ",
    "ﬁ",
    "ﬂ",
    "“",
    "”",
    "‘",
    "’",
    "«",
    "»",
    "e\u0301",
    "a\u0308",
    "\u0301",
    "Å",
    "Å",
    "\uf900",
    "\u2126",
    "㎏",
    "①",
    "²",
    "½",
    "ⅷ",
    # Scripts and symbols.
    "日本語",
    "中文",
    "한국어",
    "ひらがな",
    "カタカナ",
    "Русский",
    "العربية",
    "עברית",
    "हिन्दी",
    "ไทย",
    "Ελληνικά",
    "ქართული",
    "አማርኛ",
    "𝒥ohn",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "™",
    "€",
    "¥",
    "§",
    # Emoji: plain, skin tone, ZWJ family, flag, keycap, variation selector.
    "😀",
    "👍🏽",
    "👨\u200d👩\u200d👧",
    "🇺🇸",
    "1\ufe0f\u20e3",
    "❤\ufe0f",
    "🏳️‍🌈",
    # Digits, numbers, punctuation, URLs.
    "0",
    "42",
    "3.14",
    "1,000,000",
    "٣",
    "๓",
    "¹",
    "https://example.com/a?b=c&d=e#f",
    "www.x.org",
    "user@example.com",
    "#hashtag",
    "@mention",
    "...",
    "!!!",
    "?!",
    "--",
    "__",
    "~",
    "`",
    "^",
    "|",
    "\\",
    "/",
    "{",
    "}",
    "[",
    "]",
    "(",
    ")",
    "$",
    "%",
    "*",
    "+",
    "=",
    ":",
    ";",
    ",",
    ".",
    "'",
    '"',
    # Plain words.
    "a",
    "photo",
    "of",
    "the",
    "Cat",
    "DOG",
    "running",
    "beautiful",
    "xyzzy",
    "supercalifragilistic",
]


def _caption(rng: random.Random, templates: list[str]) -> str:
    return rng.choice(templates).format(
        adj=rng.choice(_ADJ),
        adj2=rng.choice(_ADJ),
        noun=rng.choice(_NOUN),
        noun2=rng.choice(_NOUN),
        place=rng.choice(_PLACE),
        year=rng.randint(1950, 2024),
        num=rng.randint(0, 99999),
        month=rng.choice(_MONTH),
        day=rng.randint(1, 28),
        name=rng.choice(_NAME),
    )


_SYLLABLES = [
    "ka",
    "ro",
    "mi",
    "ten",
    "sa",
    "lu",
    "ve",
    "dor",
    "an",
    "is",
    "qu",
    "bel",
    "tra",
    "on",
    "ex",
    "pho",
    "gra",
    "ny",
    "ch",
    "ei",
    "st",
    "ur",
    "mo",
    "zi",
    "wa",
    "ck",
    "le",
    "th",
    "ia",
    "po",
]


def _long_tail_words(rng: random.Random, count: int) -> list[str]:
    # Pseudo-words standing in for the rare names and tags of real captions.
    return ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4))) for _ in range(count)]


def caption_corpus(n: int, seed: int = 0, intl_fraction: float = 0.15, tail_words: int = 50_000) -> list[str]:
    """Caption-like texts; `intl_fraction` of them non-ASCII (accents, CJK, emoji, typography).

    A quarter also carry words drawn from a Zipf-like list of `tail_words` pseudo-words,
    so that word caches see the long tail of real captions rather than only templates.
    """
    rng = random.Random(seed)
    vocabulary = _long_tail_words(rng, tail_words)
    out = []
    for _ in range(n):
        templates = _INTL if rng.random() < intl_fraction else _TEMPLATES
        text = _caption(rng, templates)
        if rng.random() < 0.3:
            text += " " + _caption(rng, _TEMPLATES)
        if rng.random() < 0.25:
            # Rank r drawn with probability ~ 1/r.
            words = [vocabulary[int(tail_words ** rng.random()) - 1] for _ in range(rng.randint(1, 6))]
            text += " " + " ".join(w.capitalize() if rng.random() < 0.3 else w for w in words)
        out.append(text)
    return out


def _random_codepoints(rng: random.Random, length: int) -> str:
    chars = []
    for _ in range(length):
        r = rng.random()
        if r < 0.4:
            chars.append(chr(rng.randrange(0, 0x80)))
        elif r < 0.6:
            chars.append(chr(rng.randrange(0x80, 0x800)))
        elif r < 0.9:
            chars.append(chr(rng.randrange(0x800, 0x10000)))  # includes surrogates and private use
        else:
            chars.append(chr(rng.randrange(0x10000, 0x110000)))
    return "".join(chars)


def _mojibake(rng: random.Random, text: str) -> str:
    encoding = rng.choice(["cp1252", "latin-1", "mac_roman", "cp437", "cp1251"])
    return text.encode("utf-8").decode(encoding, errors="replace")


def junk_corpus(n: int, seed: int = 0) -> list[str]:
    """Hostile web-like texts: glued fragments, mojibake, random code points, ASCII noise."""
    rng = random.Random(seed)
    ascii_all = [chr(i) for i in range(128)]
    out = ["", " ", "\n", "\t \r\n", "&", "<", "a", "A", "'", "\x00", "\ufeff", "\ud800"]
    while len(out) < n:
        kind = rng.random()
        if kind < 0.35:
            parts = [rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 12))]
            sep = rng.choice(["", " ", " ", "\n"])
            out.append(sep.join(parts))
        elif kind < 0.5:
            out.append(_mojibake(rng, _caption(rng, _INTL + _TEMPLATES)))
        elif kind < 0.65:
            out.append(_random_codepoints(rng, rng.randint(0, 40)))
        elif kind < 0.8:
            # Printable-ish ASCII with the odd control or '&': the shortcut's border.
            out.append(
                "".join(
                    rng.choice(ascii_all) if rng.random() < 0.1 else chr(rng.randrange(32, 127))
                    for _ in range(rng.randint(0, 60))
                )
            )
        elif kind < 0.9:
            text = _caption(rng, _TEMPLATES + _INTL)
            pos = rng.randint(0, len(text))
            out.append(text[:pos] + rng.choice(FRAGMENTS) + text[pos:])
        else:
            out.append(_caption(rng, _TEMPLATES).upper() if rng.random() < 0.5 else _caption(rng, _INTL))
    return out[:n]


# Captions as they come out of web scrapes (photo titles, descriptions, alt text): real
# caption structure, damaged the ways such text is damaged in the wild.
_CJK_CAPTIONS = [
    "{place}の{noun}",
    "東京タワーの夜景",
    "京都 清水寺 {year}年",
    "桜と富士山",
    "猫がかわいい",
    "北京 故宫 {year}",
    "上海外滩夜景",
    "我的{noun}",
    "美丽的风景 {place}",
    "香港 維多利亞港",
    "서울의 밤",
    "부산 해운대 {year}",
    "우리 {noun}",
    "제주도 여행",
    "台北101 跨年煙火",
]
_EMOJI = [
    "😀",
    "😍",
    "👍",
    "👍🏽",
    "❤️",
    "❤",
    "🔥",
    "✨",
    "🌸",
    "🐱",
    "🐶",
    "📷",
    "🇯🇵",
    "🇫🇷",
    "👨\u200d👩\u200d👧",
    "🙏",
    "😂",
    "🎉",
    "☀️",
    "🌊",
]
_ENTITY_OF = {
    "'": ["&#39;", "&#039;", "&#x27;", "&apos;", "&rsquo;", "&#8217;"],
    '"': ["&quot;", "&#34;", "&ldquo;"],
    "&": ["&amp;", "&amp;amp;", "&#38;"],
    " ": ["&nbsp;", " ", " ", " "],
    "é": ["&eacute;", "&#233;"],
    "-": ["&ndash;", "&mdash;", "-"],
    "…": ["&hellip;", "..."],
    "©": ["&copy;", "(c)"],
}
_CONTROLS = [
    "\r\n",
    "\n",
    "\t",
    "\x00",
    "\u200b",
    "\ufeff",
    "\xad",
    "\xa0",
    "\x0b",
    "\x1b[0m",
    "\u2028",
    "\x85",
    "\x92",
    "\x96",
    "\u3000",
    "\u200e",
]
_URLS = [
    "http://www.flickr.com/photos/{name}/{num}/",
    "https://example.com/view?id={num}&amp;lang=en",
    "http://t.co/{num}",
    "www.{place_slug}.com",
    "https://www.youtube.com/watch?v={num}&feature=share",
]


def _entity_escape(rng: random.Random, text: str) -> str:
    # Each escapable character becomes one of the spellings web pages use for it.
    return "".join(rng.choice(_ENTITY_OF[c]) if c in _ENTITY_OF and rng.random() < 0.8 else c for c in text)


def _damage(rng: random.Random, text: str) -> str:
    if rng.random() < 0.3:
        text = _entity_escape(rng, text)
    if rng.random() < 0.15:
        text = _mojibake(rng, text)
        if rng.random() < 0.2:  # mis-decoded twice
            text = _mojibake(rng, text)
    if rng.random() < 0.3:
        words = text.split(" ")
        for _ in range(rng.randint(1, 3)):
            words.insert(rng.randint(0, len(words)), rng.choice(_EMOJI))
        text = " ".join(words)
    if rng.random() < 0.25:
        for _ in range(rng.randint(1, 3)):
            pos = rng.randint(0, len(text))
            text = text[:pos] + rng.choice(_CONTROLS) + text[pos:]
    if rng.random() < 0.1:
        text = (
            rng.choice(["<b>", "<i>", "<p>", "<br />", '<a href="http://flickr.com">'])
            + text
            + rng.choice(["</b>", "</i>", "</p>", "<br>", "</a>"])
        )
    return text


def web_caption_corpus(n: int, seed: int = 0) -> list[str]:
    """Web captions heavy in HTML entities, mojibake, CJK, emoji, control characters and URLs.

    Each is a title, often followed by a description or a tag list, built like
    `caption_corpus`'s and then damaged: entity-escaped (sometimes twice), read in
    the wrong encoding, sprinkled with emoji and control characters, wrapped in tags.
    """
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.3:
            text = _caption(rng, _CJK_CAPTIONS)
        elif kind < 0.55:
            text = _caption(rng, _INTL)
        else:
            text = _caption(rng, _TEMPLATES)
        if rng.random() < 0.5:
            text += rng.choice([" - ", " | ", ". ", "\n", "\r\n", " :: "]) + _caption(
                rng, _TEMPLATES + _INTL + _CJK_CAPTIONS
            )
        if rng.random() < 0.15:
            text += " " + rng.choice(_URLS).format(
                name=rng.choice(_NAME),
                num=rng.randint(0, 10**9),
                place_slug=rng.choice(_PLACE).lower().replace(" ", ""),
            )
        if rng.random() < 0.2:
            text += " " + " ".join("#" + rng.choice(_NOUN + _ADJ) for _ in range(rng.randint(1, 5)))
        out.append(_damage(rng, text))
    return out


def long_texts(seed: int = 0) -> list[str]:
    """Texts far past the context length, some with many lines (ftfy works line by line)."""
    rng = random.Random(seed)
    words = [rng.choice(FRAGMENTS) for _ in range(3000)]
    return [
        " ".join(caption_corpus(400, seed)),
        "".join(words),
        "\n".join(words),
        "x" * 20000,
        "é" * 5000,
        "Ã©" * 3000,
        "日本" * 4000,
        "<b>" + "&amp;" * 2000,
        "&amp;" * 2000 + "\n<b>\n" + "&amp;" * 10,
    ]


# ---------------------------------------------------------------------------------------------
# records

COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 200, 40),
    "blue": (30, 40, 220),
    "yellow": (230, 220, 30),
    "black": (10, 10, 10),
    "white": (245, 245, 245),
    "purple": (140, 30, 160),
    "orange": (250, 140, 20),
}


def write_colour_records(prefix: Path, n: int, side: int = 40, seed: int = 0) -> Path:
    """`prefix`.rec/.idx: n noisy flat-colour JPEGs captioned with their colour's name.

    Learnable in a few dozen steps (the loss falls well below ln(batch)), and tiny.
    """
    import cv2
    import numpy as np

    from src.open_alip.tokenizer import tokenize_np
    from src.recordio import IRHeader, MXIndexedRecordIO, pack

    names = list(COLOURS)
    tokens = tokenize_np([f"a photo of a {name} square" for name in names]).astype(np.float32)
    rng = np.random.default_rng(seed)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    with MXIndexedRecordIO(f"{prefix}.idx", f"{prefix}.rec", "w") as rec:
        for i in range(n):
            c = i % len(names)
            img = np.clip(np.array(COLOURS[names[c]][::-1]) + rng.normal(0, 12, (side, side, 3)), 0, 255)
            jpg = cv2.imencode(".jpg", img.astype(np.uint8), [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes()
            rec.write_idx(i, pack(IRHeader(0, tokens[c], i, 0), jpg))
    return prefix
