"""``open_target(path)``: any checkpoint dynjax can read, as one
:class:`~dynjax.audit.targets.base.Target`.

:func:`dynjax.runs.opener.open_checkpoint` recognises the kind (a train.py LM or classifier
run, an HF directory of a ported ``model_type``, a MUDDPythia directory; anything else is
one line); this module maps each kind to its target class. ``kind=`` insists on one
(audit.py's ``--muddpythia`` / ``--hf``).
"""
from __future__ import annotations

import json

from dynjax import configs
from dynjax.audit.targets.base import Target
from dynjax.audit.targets.hf import HfDir
from dynjax.audit.targets.muddpythia import MuddPythiaDir
from dynjax.audit.targets.train_runs import ClassifierRun, LmRun
from dynjax.errors import AuditError
from dynjax.runs.opener import open_checkpoint

KINDS = {k.kind: k for k in (LmRun, ClassifierRun, MuddPythiaDir, HfDir)}


def open_target(path, kind: str | None = None, config=None, step: int | None = None) -> Target:
    """The checkpoint at ``path`` (``RUN:STEP`` and repo ids too; its kind recognised, or
    ``kind``). ``config``: the audit config, whose section of the kind (``muddpythia``,
    ``hf``: the dtype weights load in) applies; None: the defaults. ``step``: a train.py
    run's saved step (None: the latest); a kind with one set of weights refuses one."""
    train = f"{configs.command('train', 'tiny:feature_gate')} --workdir={path}"
    found = open_checkpoint(path, kind, step, train=train)
    return KINDS[found.kind](found.path, config, found.step)


def check_compatible(targets) -> None:
    """The checkpoints of one audit share their kind and each kind's same-run facts (window
    length, model, training data); else an AuditError naming what differs."""
    kinds = sorted({t.kind for t in targets})
    if len(kinds) > 1:
        raise AuditError(f"the checkpoints are of different kinds ({', '.join(kinds)}); audit "
                         "one kind of checkpoint per run")
    facts = [t.same_run_facts() for t in targets]
    for what in facts[0]:
        values = {json.dumps(f[what], sort_keys=True) for f in facts}
        if len(values) > 1:
            raise AuditError(f"the checkpoints differ in {what} ({sorted(values)}); audit the "
                             "seeds of one model and data configuration together")
