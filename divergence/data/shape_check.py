"""A GenEval-style checker for images of the embedded shapes dataset, built from its procedural truth.

GenEval (Ghosh et al., NeurIPS 2023) scores a text-to-image model by asking, of each generated
image, whether it shows what its prompt says: the object, its colour, its position. Here the
dataset is procedural (``divergence.data.shapes``), so the truth of an image is known exactly and
the checker is a direct pixel test, not a learned detector:

- **background**: the image's per-channel median (the dataset's background is one flat dark grey
  and a shape covers at most 16% of a one-shape image);
- **foreground**: a pixel nearer (Euclidean, in RGB) to one of the six palette colours than to the
  background, i.e. at least about half covered by a shape after the dataset's anti-aliasing;
- **colour**: the palette colour most foreground pixels are a mix of with the background (the
  nearest segment from background to colour: an anti-aliased edge of a small yellow shape is
  nearer green than yellow, but on yellow's segment);
- **the shape's blob**: the 4-connected component of that colour's pixels that holds the pixel
  with the most same-colour neighbours (stray pixels elsewhere do not move it);
- **coverage**: each pixel's share of the colour against the background,
  ``alpha = <p - b, c - b> / |c - b|^2`` clipped to [0, 1], within one pixel of the blob (the
  dataset draws at 4x and downsamples, so edge pixels are such mixtures);
- **position**: the 3 x 3 grid cell of the coverage's centroid (shapes are drawn centred in a cell);
- **shape**: a triangle (apex up, base = height: its rows' coverage rises linearly to the base)
  has vertical skewness -2 sqrt(2) / 5 = -0.566, a circle and a square 0: below half of that, a
  triangle. Otherwise the fill of the soft bounding box, ``area / (width x height)`` with the
  widths the sums of the coverage's column and row maxima: a square fills 1, a circle
  pi / 4 = 0.785; at or above halfway (``SQUARE_FROM``), a square. On the dataset's own 32 x 32
  one-shape images the features fall far from both thresholds (fill: circles 0.77-0.86, squares
  0.98-0.99, triangles 0.56-0.62; skewness: triangles -0.59 to -0.50, the others within 0.08).

It reads one-shape images (GenEval's single-object, colour and position tasks); the checker's
answer depends on the image only, so on images unrelated to their captions (noise) the expected
hit rate of an attribute with ``k`` equally often named classes is exactly ``1 / k``
(``chance_levels``). Size is stated by captions and kept in ``Scene`` but not scored.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from divergence.data.shapes import COLOURS, POSITIONS, SHAPES, SIZES

ATTRIBUTES = ("colour", "shape", "position")  # scored; "object": colour and shape; "all": the three
COLOUR_NAMES = tuple(COLOURS)
SIZE_NAMES = tuple(SIZES)
POSITION_NAMES = tuple(name for name, _, _ in POSITIONS)
NUM_CLASSES = {"colour": len(COLOUR_NAMES), "shape": len(SHAPES), "position": len(POSITIONS)}
# The triangle's rows hold a triangular distribution (density rising to the base): skewness
# -2 sqrt(2) / 5 = -0.566 with y downwards; a circle's and a square's are 0. Halfway between:
TRIANGLE_SKEW_BELOW = -(2 * 2**0.5 / 5) / 2
SQUARE_FROM = (torch.pi / 4 + 1.0) / 2  # fill between a circle's 0.785 and a square's 1
_PALETTE = torch.tensor(list(COLOURS.values()), dtype=torch.float32)  # (6, 3)
_CELL = {(column, row): index for index, (_, column, row) in enumerate(POSITIONS)}
_PHRASE = re.compile(
    rf"^a ({'|'.join(SIZE_NAMES)}) ({'|'.join(COLOUR_NAMES)}) ({'|'.join(SHAPES)}) ({'|'.join(POSITION_NAMES)})$"
)


@dataclass(frozen=True)
class Scene:
    """What a one-shape caption states, as class indices into the dataset's tables."""

    size: int  # SIZE_NAMES
    colour: int  # COLOUR_NAMES
    shape: int  # SHAPES
    position: int  # POSITIONS

    @property
    def caption(self) -> str:
        """The caption the dataset renders for this scene (``divergence.data.shapes.render``)."""
        return f"a {SIZE_NAMES[self.size]} {COLOUR_NAMES[self.colour]} {SHAPES[self.shape]} {POSITION_NAMES[self.position]}"


def parse_caption(caption: str) -> Scene:
    """The ``Scene`` of a one-shape caption of the dataset; ``ValueError`` naming it otherwise."""
    match = _PHRASE.match(caption)
    if match is None:
        raise ValueError(f"caption {caption!r}: not a one-shape caption of the shapes dataset")
    size, colour, shape, position = match.groups()
    return Scene(
        SIZE_NAMES.index(size), COLOUR_NAMES.index(colour), SHAPES.index(shape), POSITION_NAMES.index(position)
    )


def evaluation_captions() -> list[str]:
    """Every one-shape caption, each (colour, shape, position) once per size: 324, in a fixed order.

    Each class of each scored attribute is named equally often and every combination of the three
    appears, so a checker blind to the image hits each attribute at ``chance_levels``."""
    combos = itertools.product(range(len(POSITIONS)), range(len(COLOUR_NAMES)), range(len(SHAPES)), range(len(SIZES)))
    return [Scene(size, colour, shape, position).caption for position, colour, shape, size in combos]


def chance_levels() -> dict[str, float]:
    """The expected hit rate of a caption-blind answer over ``evaluation_captions``: 1 / classes
    (colour 1/6, shape 1/3, position 1/9), the object (colour and shape) 1 / 18, and all three at
    once 1 / 162."""
    levels = {name: 1.0 / count for name, count in NUM_CLASSES.items()}
    levels["object"] = 1.0 / (NUM_CLASSES["colour"] * NUM_CLASSES["shape"])
    levels["all"] = 1.0 / (NUM_CLASSES["colour"] * NUM_CLASSES["shape"] * NUM_CLASSES["position"])
    return levels


def read_attributes(images: torch.Tensor) -> dict[str, torch.Tensor]:
    """The colour, shape and position the checker reads in each image: ``{attribute: (N,) int64}``
    class indices, -1 where no shape is found. ``images``: (N, H, W, 3) uint8 (``generate``'s layout)."""
    if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != torch.uint8:
        raise ValueError(f"images: expected (N, H, W, 3) uint8, got {tuple(images.shape)} {images.dtype}")
    x = images.float()
    n, height, width, _ = x.shape
    background = x.reshape(n, -1, 3).median(dim=1).values  # (N, 3)
    to_palette = torch.cdist(x.reshape(n, -1, 3), _PALETTE.expand(n, -1, -1)).reshape(n, height, width, -1)
    to_background = torch.linalg.vector_norm(x - background[:, None, None, :], dim=-1)
    foreground = to_palette.min(dim=-1).values < to_background  # (N, H, W)
    nearest = _mixture_residual(x, background).argmin(dim=-1)  # (N, H, W): the colour it is a mix of
    counts = F.one_hot(nearest, len(COLOUR_NAMES)).mul(foreground[..., None]).sum(dim=(1, 2))  # (N, 6)
    found = counts.sum(dim=1) > 0
    colour = counts.argmax(dim=1)
    blob = _main_blob(foreground & (nearest == colour[:, None, None]))
    alpha = _coverage(x, background, _PALETTE[colour], blob)
    found &= alpha.sum(dim=(1, 2)) > 0
    none = torch.full_like(colour, -1)
    return {
        "colour": torch.where(found, colour, none),
        "shape": torch.where(found, _shape_of(alpha), none),
        "position": torch.where(found, _cell_of(alpha), none),
    }


def score(images: torch.Tensor, captions: list[str]) -> dict[str, torch.Tensor]:
    """``{attribute: (N,) bool}``: whether image ``i`` shows caption ``i``'s colour, shape and
    position, ``"object"``: colour and shape (the object asked for, wherever it is), and ``"all"``:
    the three together."""
    if len(captions) != images.shape[0]:
        raise ValueError(f"captions: {len(captions)} for {images.shape[0]} images")
    scenes = [parse_caption(caption) for caption in captions]
    read = read_attributes(images)
    hits = {name: read[name] == torch.tensor([getattr(s, name) for s in scenes]) for name in ATTRIBUTES}
    hits["object"] = hits["colour"] & hits["shape"]
    hits["all"] = hits["object"] & hits["position"]
    return hits


def _main_blob(mask: torch.Tensor) -> torch.Tensor:
    """The 4-connected component of ``mask`` (N, H, W) through its pixel with the most mask pixels
    in its 3 x 3 neighbourhood; all False where the mask is empty."""
    padded = F.pad(mask.to(torch.int32), (1, 1, 1, 1))
    h, w = mask.shape[1:]
    density = sum(padded[:, i : i + h, j : j + w] for i in range(3) for j in range(3)) * mask
    flat = density.flatten(1)
    seed = torch.zeros_like(flat, dtype=torch.bool)
    seed.scatter_(1, flat.argmax(dim=1, keepdim=True), True)
    blob = seed.reshape(mask.shape) & mask
    while True:  # grow one pixel a round within the mask until nothing changes (at most H x W rounds)
        p = F.pad(blob, (1, 1, 1, 1))
        grown = (blob | p[:, :-2, 1:-1] | p[:, 2:, 1:-1] | p[:, 1:-1, :-2] | p[:, 1:-1, 2:]) & mask
        if torch.equal(grown, blob):
            return blob
        blob = grown


def _mixture_residual(x: torch.Tensor, background: torch.Tensor) -> torch.Tensor:
    """(N, H, W, 6): each pixel's distance from the segment between the background and each palette
    colour, ``|p - b - alpha (c - b)|`` with ``alpha`` clipped to [0, 1]: an anti-aliased edge pixel
    (``alpha c + (1 - alpha) b``) is on its colour's segment, though it may be nearer another colour."""
    direction = _PALETTE[None, :, :] - background[:, None, :]  # (N, 6, 3)
    offset = (x - background[:, None, None, :])[..., None, :]  # (N, H, W, 1, 3)
    d = direction[:, None, None]  # (N, 1, 1, 6, 3)
    alpha = ((offset * d).sum(-1) / d.square().sum(-1).clamp(min=1.0)).clamp(0.0, 1.0)
    return torch.linalg.vector_norm(offset - alpha[..., None] * d, dim=-1)


def _coverage(x: torch.Tensor, background: torch.Tensor, colour: torch.Tensor, blob: torch.Tensor) -> torch.Tensor:
    """(N, H, W) soft coverage of each pixel by the shape: ``alpha = <p - b, c - b> / |c - b|^2``
    clipped to [0, 1] (a pixel drawn as ``alpha c + (1 - alpha) b`` gives its alpha back), kept
    within one pixel of the blob so other marks do not count."""
    direction = (colour - background)[:, None, None, :]  # (N, 1, 1, 3)
    along = ((x - background[:, None, None, :]) * direction).sum(dim=-1)
    alpha = (along / direction.square().sum(dim=-1).clamp(min=1.0)).clamp(0.0, 1.0)
    near = F.max_pool2d(blob.float()[:, None], 3, stride=1, padding=1)[:, 0] > 0
    return alpha * near


def _shape_of(alpha: torch.Tensor) -> torch.Tensor:
    """SHAPES index of each coverage map (N, H, W) from its vertical skewness and fill (module docstring)."""
    area = alpha.sum(dim=(1, 2)).clamp(min=1e-6)
    rows = alpha.sum(dim=2) / area[:, None]  # (N, H): the coverage's distribution over rows
    y = torch.arange(alpha.shape[1], dtype=alpha.dtype) + 0.5
    mean = (rows * y).sum(dim=1, keepdim=True)
    variance = (rows * (y - mean).square()).sum(dim=1).clamp(min=1e-6)
    skewness = (rows * (y - mean) ** 3).sum(dim=1) / variance**1.5
    width, height = alpha.amax(dim=1).sum(dim=1), alpha.amax(dim=2).sum(dim=1)  # soft extents
    fill = area / (width * height).clamp(min=1e-6)
    circle_or_square = torch.where(fill >= SQUARE_FROM, SHAPES.index("square"), SHAPES.index("circle"))
    return torch.where(skewness < TRIANGLE_SKEW_BELOW, SHAPES.index("triangle"), circle_or_square)


def _cell_of(alpha: torch.Tensor) -> torch.Tensor:
    """POSITIONS index of the 3 x 3 cell of each coverage map's centroid."""
    n, height, width = alpha.shape
    area = alpha.sum(dim=(1, 2)).clamp(min=1e-6)
    ys = (alpha.sum(dim=2) * (torch.arange(height) + 0.5)).sum(dim=1) / area
    xs = (alpha.sum(dim=1) * (torch.arange(width) + 0.5)).sum(dim=1) / area
    column = (xs * 3 / width).floor().long().clamp(0, 2)
    row = (ys * 3 / height).floor().long().clamp(0, 2)
    lookup = torch.tensor([[_CELL[(c, r)] for c in range(3)] for r in range(3)])
    return lookup[row, column]
