"""Score one checkpoint of any kind: open it, audit it, time it, judge it."""
from __future__ import annotations

from pathlib import Path

import jax
import numpy as np

from dynjax.audit import run as audit_run
from dynjax.audit.targets import open_target
from dynjax.scorecard.panels import dependence, variation, verdicts


def score(path: str, config, out_dir, log=print, kind: str | None = None) -> dict:
    """The scorecard of one checkpoint of any kind (:func:`dynjax.audit.targets.open_target`; ``kind``
    as there): the audit (``config.audit``, as the kind adapts it) for variation and
    dependence, then the kind's execution panel; verdicts by ``config.thresholds``."""
    target = open_target(path, kind=kind, config=config.audit)
    audit_config = target.scorecard_audit_config(config)
    card = {"run": str(path), "model": target.label,
            "params": int(sum(np.prod(p.shape) for p in jax.tree.leaves(target.params))),
            **target.card_extra()}
    route = getattr(getattr(target.model.cfg, "mod", None), "route", "topk")
    if target.family == "mod" and route != "topk":   # the top-k forward is report's default
        card["forward"] = (f"dependence and execution: the causal {route} rule (a token "
                           "enters when its logit > 0, up to the slot budget)")
    params = jax.device_put(target.params)   # HF weights load as host arrays
    audit = None
    if target.has_coefficients:
        log(f"{path}: auditing ({audit_config.data.eval_windows} windows, "
            f"{audit_config.reassignments} reassignments)")
        audit = audit_run.audit_from_config(audit_config, out=str(Path(out_dir) / "audit"),
                                            progress=False, log=log, targets=[target])
    data_cfg = audit_config.data.copy_and_resolve_references()
    if audit is not None and "seq_len" in audit["meta"]["windows"]:
        data_cfg.seq_len = audit["meta"]["windows"]["seq_len"]
    _, ev, _ = target.windows(data_cfg, 0, target.execution_windows(config))
    ev = target.task.prepare(ev)
    coeffs = None
    if audit is not None:
        _, coeffs = jax.jit(target.apply_fn)(params, target.task.inputs(ev))
        card["variation"] = variation(audit, coeffs, target.model.cfg, target.schema,
                                      target.family)
        card["dependence"] = dependence(audit)
    log(f"{path}: timing against {target.baseline}")
    card["execution"] = target.execution(params, ev, config, coeffs)
    card["verdicts"] = verdicts(card, config.thresholds)
    card["thresholds"] = config.thresholds.to_dict()
    return card


