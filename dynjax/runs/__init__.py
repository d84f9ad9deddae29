"""Checkpoints as targets: ``open_target(path)`` gives every kind (train.py runs, HF
directories) one interface (model, params, task, windows, execution panel) that the audit
and the scorecard are written against. See docs/targets.md."""
from dynjax.runs.hf import HfDir
from dynjax.runs.muddpythia import MuddPythiaDir
from dynjax.runs.target import KINDS, check_compatible, open_target
from dynjax.runs.train_runs import ClassifierRun, LmRun

__all__ = ["KINDS", "ClassifierRun", "HfDir", "LmRun", "MuddPythiaDir", "check_compatible",
           "open_target"]
