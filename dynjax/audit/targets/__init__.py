"""The audit's checkpoint targets: ``open_target(path)`` gives every kind of checkpoint
(train.py runs, HF and MUDDPythia directories) one interface (model, params, task, windows,
execution panel, text) that the audit, the scorecard and the sampler are written against
(docs/targets.md)."""
from dynjax.audit.targets.hf import HfDir
from dynjax.audit.targets.kinds import KINDS, check_compatible, open_target
from dynjax.audit.targets.muddpythia import MuddPythiaDir
from dynjax.audit.targets.train_runs import ClassifierRun, LmRun

__all__ = ["KINDS", "ClassifierRun", "HfDir", "LmRun", "MuddPythiaDir", "check_compatible",
           "open_target"]
