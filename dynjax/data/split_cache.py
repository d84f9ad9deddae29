"""Classification splits ``{split: (x, y)}`` cached as one ``.npz``, so that a dataset is
parsed once (a 110 MB CSV, a TFDS dataset decoded example by example) and then loads in
seconds. Written to a temporary name and renamed: a cache is whole or absent; one that is
corrupt anyway (a disk error, a copy cut short, another program's file) is rebuilt."""
from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np

SPLITS = ("train", "validation", "test")


def cached_splits(cache: Path, build: Callable[[], dict]) -> dict:
    """Read ``cache`` if it exists and is whole, else ``build()`` the splits and write them
    there (a corrupt cache is replaced, with a warning naming it)."""
    if cache.exists():
        try:
            with np.load(cache) as f:
                return {s: (f[f"{s}_x"], f[f"{s}_y"]) for s in SPLITS}
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
            print(f"warning: split cache {cache} is unreadable ({type(e).__name__}: {e}); "
                  "rebuilding it", file=sys.stderr)
    splits = build()
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(cache.name + ".tmp.npz")
    np.savez(tmp, **{f"{s}_{k}": a for s, (x, y) in splits.items() for k, a in
                     (("x", x), ("y", y))})
    os.replace(tmp, cache)
    return splits
