"""Deterministic synthetic scenes whose captions say exactly what is drawn.

A scene is one to three copies of a coloured shape, grouped in one region of a plain, lightly
textured background. The caption names the count, colour, shape and region ("two blue squares
at the top"), so a tiny CLIP can learn the words from the pixels in a few CPU minutes, and
zero-shot classification over colour x shape has a known chance level.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from PIL import Image, ImageDraw

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (215, 40, 40),
    "green": (40, 170, 60),
    "blue": (45, 75, 220),
    "yellow": (235, 205, 35),
}
SHAPES = ("circle", "square", "triangle")
# region name -> vertical centre of the group as a fraction of the image side. Only vertical
# positions are named: training flips images left-right, which would make "left"/"right" lie.
REGIONS: dict[str, float] = {
    "at the top": 0.25,
    "in the middle": 0.5,
    "at the bottom": 0.75,
}
COUNT_WORDS = {1: "one", 2: "two", 3: "three"}

# Phrasings used for training captions; {} is the scene description without an article.
CAPTION_FORMS = (
    "{a} {desc}",
    "a picture of {a} {desc}",
    "{a} {desc} on a plain background",
    "a drawing of {a} {desc}",
    "an image showing {a} {desc}",
)
# Prompt templates for zero-shot classification (colour x shape classes).
DEMO_TEMPLATES = ("a {}.", "a picture of a {}.", "a drawing of a {}.", "a {} on a plain background.")


@dataclass(frozen=True)
class Scene:
    colour: str
    shape: str
    count: int
    region: str
    seed: int

    @property
    def classname(self) -> str:
        return f"{self.colour} {self.shape}"

    def description(self) -> str:
        """'two blue squares at the top' (count 1 gives 'red circle on the left' without article)."""
        noun = self.shape if self.count == 1 else self.shape + "s"
        if self.count == 1:
            return f"{self.colour} {noun} {self.region}"
        return f"{COUNT_WORDS[self.count]} {self.colour} {noun} {self.region}"

    def caption(self, form: int = 0) -> str:
        desc = self.description()
        article = ("an" if desc[0] in "aeiou" else "a") if self.count == 1 else ""
        text = CAPTION_FORMS[form % len(CAPTION_FORMS)].format(a=article, desc=desc)
        return " ".join(text.split())


def classnames() -> list[str]:
    """All colour x shape class names, in a fixed order."""
    return [f"{c} {s}" for c in COLOURS for s in SHAPES]


def random_scene(rng: random.Random, count: int | None = None) -> Scene:
    return Scene(
        colour=rng.choice(list(COLOURS)),
        shape=rng.choice(SHAPES),
        count=count if count is not None else rng.choice((1, 1, 2, 3)),
        region=rng.choice(list(REGIONS)),
        seed=rng.getrandbits(32),
    )


def _jitter(colour: tuple[int, int, int], rng: random.Random, amount: int) -> tuple[int, int, int]:
    return tuple(max(0, min(255, c + rng.randint(-amount, amount))) for c in colour)  # type: ignore[return-value]


def draw_scene(scene: Scene, size: int = 64) -> Image.Image:
    """Render a scene; the same scene always gives the same pixels."""
    rng = random.Random(scene.seed)
    shade = rng.randint(200, 245)
    img = Image.new("RGB", (size, size), (shade, shade, shade - rng.randint(0, 15)))
    draw = ImageDraw.Draw(img)
    for _ in range(6):  # faint texture so backgrounds are not all identical
        x0, y0 = rng.randrange(size), rng.randrange(size)
        tone = shade - rng.randint(5, 25)
        draw.line(
            (x0, y0, x0 + rng.randint(-size // 3, size // 3), y0 + rng.randint(-size // 3, size // 3)),
            fill=(tone, tone, tone),
            width=1,
        )
    cy = REGIONS[scene.region]
    radius = size * (0.2 if scene.count == 1 else 0.13) * rng.uniform(0.85, 1.15)
    # a group of n shapes side by side, placed anywhere along the row that fits it
    offsets = {1: [0.0], 2: [-1.15, 1.15], 3: [-2.2, 0.0, 2.2]}[scene.count]
    half_width = (max(offsets) + 1.05) * radius / size
    cx = rng.uniform(max(0.5 - 0.3, half_width), min(0.5 + 0.3, 1 - half_width))
    for off in offsets:
        x = cx * size + off * radius + rng.uniform(-1.0, 1.0)
        y = cy * size + rng.uniform(-1.5, 1.5)
        fill = _jitter(COLOURS[scene.colour], rng, 18)
        r = radius
        if scene.shape == "circle":
            draw.ellipse((x - r, y - r, x + r, y + r), fill=fill)
        elif scene.shape == "square":
            s = r * 0.9
            draw.rectangle((x - s, y - s, x + s, y + s), fill=fill)
        else:
            draw.polygon([(x, y - r), (x - r, y + r * 0.8), (x + r, y + r * 0.8)], fill=fill)
    return img


def all_descriptions() -> list[str]:
    """Every distinct scene description (count x colour x shape x region): the caption vocabulary
    a model picks from when the demo shows 'predicted captions'."""
    out = []
    for count in COUNT_WORDS:
        for colour in COLOURS:
            for shape in SHAPES:
                for region in REGIONS:
                    out.append(Scene(colour, shape, count, region, 0).description())
    return out
