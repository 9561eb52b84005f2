"""Rewrite PNG plots as 256-colour palette PNGs before committing them (about a third of the
bytes; a plot has a few thousand colours, so the picture does not change: the mean pixel
difference is below 0.1 of 255).

    .venv/bin/python bench/shrink_png.py bench/results/eval_h200_loss.png [...]
"""

from __future__ import annotations

import sys
from pathlib import Path

from PIL import Image


def shrink(path: Path) -> tuple[int, int]:
    """Rewrite ``path`` in place; (bytes before, bytes after). A palette PNG is left as it is."""
    before = path.stat().st_size
    with Image.open(path) as image:
        if image.mode == "P":
            return before, before
        palette = image.convert("RGB").quantize(
            colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE
        )
    palette.save(path, optimize=True)
    return before, path.stat().st_size


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    for name in paths:
        before, after = shrink(Path(name))
        print(f"{name}: {before:,} -> {after:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
