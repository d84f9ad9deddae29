"""Run directories and checkpoints as targets.

:mod:`~dynjax.runs.rundir` (the run directory's format, read without training code) and
:mod:`~dynjax.runs.integrity` (per-array checksums) sit below ``dynjax.train``, which writes
runs; ``open_target(path)`` gives every kind of checkpoint (train.py runs, HF directories)
one interface (model, params, task, windows, execution panel, text) that the audit, the
scorecard and the sampler are written against (docs/targets.md). The targets import the
audit's settings, so they load on first use: the trainer imports ``dynjax.runs.rundir``
without them.
"""
import importlib

_NAMES = {"HfDir": "hf", "MuddPythiaDir": "muddpythia", "KINDS": "target",
          "check_compatible": "target", "open_target": "target", "ClassifierRun": "train_runs",
          "LmRun": "train_runs"}
__all__ = sorted(_NAMES)


def __getattr__(name):
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
