"""The embedded default dataset: seeded, procedurally generated captioned shapes.

Each example is one or two shapes (circle, square, triangle) of a colour and a size at one of
nine positions, on a dark background, with a caption that says so: "a small red circle at the
top left and a large blue square at the bottom right". Example ``i`` of seed ``s`` is a pure
function of ``(s, i)``, so the dataset needs no files and two machines render the same pixels.
Shapes are drawn at 4x and downsampled for smooth edges.
"""

from __future__ import annotations

import random

from PIL import Image, ImageDraw

from divergence.recipe.seeds import derive_seed

COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 180, 60),
    "blue": (50, 80, 230),
    "yellow": (240, 220, 40),
    "purple": (150, 60, 200),
    "white": (240, 240, 240),
}
SHAPES = ("circle", "square", "triangle")
SIZES = {"small": 0.22, "large": 0.4}  # shape side as a fraction of the image side
# (name, column, row) of the 3x3 grid of positions.
POSITIONS = (
    ("at the top left", 0, 0),
    ("at the top", 1, 0),
    ("at the top right", 2, 0),
    ("at the left", 0, 1),
    ("in the centre", 1, 1),
    ("at the right", 2, 1),
    ("at the bottom left", 0, 2),
    ("at the bottom", 1, 2),
    ("at the bottom right", 2, 2),
)
_SUPERSAMPLE = 4


def caption_words() -> tuple[str, ...]:
    """Every word a caption of this dataset uses, sorted: "a", "and", the sizes, colours and shapes,
    and the words of the position phrases (``model.tokenizer.kind: words`` gives each one id)."""
    words = {"a", "and", *SIZES, *COLOURS, *SHAPES}
    for phrase, _, _ in POSITIONS:
        words.update(phrase.split())
    return tuple(sorted(words))


class ShapesDataset:
    """``len`` examples of (PIL RGB image, caption), rendered on demand from ``(seed, index)``."""

    def __init__(self, seed: int, num_examples: int, resolution: int, max_shapes: int = 2):
        self.seed, self.num_examples, self.resolution, self.max_shapes = seed, num_examples, resolution, max_shapes

    def __len__(self) -> int:
        return self.num_examples

    def __getitem__(self, index: int) -> tuple[Image.Image, str]:
        if not 0 <= index < self.num_examples:
            raise IndexError(index)
        return render(random.Random(derive_seed(self.seed, "shapes", index)), self.resolution, self.max_shapes)


def render(rng: random.Random, resolution: int, max_shapes: int = 2) -> tuple[Image.Image, str]:
    """One image and its caption from ``rng``: one or two shapes at distinct positions (at most
    ``max_shapes``; the count is drawn either way, so ``max_shapes=2`` renders what it always has)."""
    side = resolution * _SUPERSAMPLE
    shade = rng.randint(0, 40)
    image = Image.new("RGB", (side, side), (shade, shade, shade + 10))
    draw = ImageDraw.Draw(image)
    phrases = []
    for position in rng.sample(POSITIONS, k=min(rng.choice((1, 1, 2)), max_shapes)):
        size, colour, shape = rng.choice(tuple(SIZES)), rng.choice(tuple(COLOURS)), rng.choice(SHAPES)
        _draw(draw, shape, COLOURS[colour], position[1:], SIZES[size] * side, side)
        phrases.append(f"a {size} {colour} {shape} {position[0]}")
    return image.resize((resolution, resolution), Image.LANCZOS), " and ".join(phrases)


def _draw(draw: ImageDraw.ImageDraw, shape: str, rgb, cell: tuple[int, int], extent: float, side: int):
    cx, cy = ((c + 0.5) * side / 3 for c in cell)
    h = extent / 2
    if shape == "circle":
        draw.ellipse((cx - h, cy - h, cx + h, cy + h), fill=rgb)
    elif shape == "square":
        draw.rectangle((cx - h, cy - h, cx + h, cy + h), fill=rgb)
    else:
        draw.polygon(((cx, cy - h), (cx + h, cy + h), (cx - h, cy + h)), fill=rgb)
