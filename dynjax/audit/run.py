"""The audit's driver and audit.py's program: config in, report out.

:func:`audit_from_config` ties the checkpoints (:mod:`dynjax.audit.targets`: model, params,
windows), the engine (per checkpoint),
summary.py (statistics) and report.py together; :func:`audit_targets` audits several
checkpoints on the same windows; :func:`combine_dirs` joins audits run apart;
:func:`verdict_table` prints the outcome.
"""
from __future__ import annotations

import json
import os
import time
from typing import Sequence

import jax
import numpy as np

from dynjax.audit import families as families_lib
from dynjax.audit import interventions
from dynjax.audit.engine import Engine, schema_signature
from dynjax.audit.per_checkpoint import audit_checkpoint
from dynjax.audit.placement import Placement
from dynjax.audit.report import replay_status
from dynjax.audit.settings import (Settings, applicable, n_windows, window_spec,
                                   windows_sha256)
from dynjax.audit.summary import assemble_results, combine_stored
from dynjax.jsonio import command_line
from dynjax.parallel import distributed, sharding
from dynjax.audit.targets import check_compatible, open_target
from dynjax.audit.targets.windows import opt
from dynjax.errors import AuditError, ReplayError
from dynjax.tasks import LM, Task

__all__ = ["AuditError", "ReplayError", "audit_from_config", "combine_dirs", "verdict_table"]


def audit_from_config(config, run_dirs: Sequence[str] = (), muddpythia_dir: str | None = None,
                      out: str | None = None, progress: bool = True, log=print,
                      targets: Sequence | None = None, hf_dir: str | None = None) -> dict:
    """The whole audit.py program: checkpoints, windows, engine, statistics, report; returns
    the results. The checkpoints are ``run_dirs`` (any kind :func:`dynjax.audit.targets.open_target`
    recognises), a MUDDPythia or HF directory, or ``targets`` already opened."""
    from dynjax.audit import report

    progress = progress and distributed.is_main()   # other processes of a multi-host run
    settings = Settings.from_config(config)
    dc = config.data
    targets = list(targets or []) or _open_targets(config, run_dirs, muddpythia_dir, hf_dir)
    for t in targets:
        t.require_coefficients()
    check_compatible(targets)
    plan = targets[0].plan(config, settings)
    if plan:
        log(targets[0].format_plan(plan))
    calib, ev, data_info = targets[0].windows(dc, int(dc.calib_windows), int(dc.eval_windows))
    task = targets[0].task
    meta = type(targets[0]).audit_meta(targets, plan)
    for t in targets:
        for note in t.notes:
            log(f"warning: {note}")
    for note in data_info.get("notes", []):
        log(f"warning: {note}")
    meta.update(config=config.to_dict(), data=data_info)
    t0 = time.perf_counter()
    results = audit_targets([t.audit_target() for t in targets], calib, ev, settings,
                            type(targets[0]).title(targets), meta=meta, progress=progress,
                            task=task, placement=placement_of(config),
                            sites=config.get("sites"))
    for name in results["meta"]["not_applicable"]:
        log(f"note: {name} not applicable: {results['meta']['not_applicable'][name]}")
    results["meta"]["wall_seconds"] = time.perf_counter() - t0
    results["meta"]["command"] = command_line()   # what wrote the report
    if not results["replay"]["exact"]:
        log(f"warning: replay {replay_status(results['replay'])}")
    if results.get("small_n_warning"):
        log(f"warning: {results['small_n_warning']}")
    if len(targets) == 1:
        results["meta"]["single_checkpoint_note"] = (
            "one checkpoint: intervals describe stability over evaluation windows and "
            "reassignments for this checkpoint, not uncertainty across training seeds")
    if out and distributed.is_main():
        report.write_report(results, out)
    return results


def _open_targets(config, run_dirs, muddpythia_dir, hf_dir) -> list:
    """The checkpoints audit.py was given: run directories, or one MUDDPythia or HF
    directory (``--muddpythia`` / ``--hf``, or the config's ``muddpythia.path`` /
    ``hf.path``)."""
    named = {"muddpythia": muddpythia_dir or opt(config.get("muddpythia"), "path"),
             "hf": hf_dir or opt(config.get("hf"), "path")}
    named = {kind: path for kind, path in named.items() if path}
    if len(named) + bool(run_dirs) > 1:
        raise AuditError("pass one of --checkpoints (dynjax runs), --muddpythia or --hf, "
                         "not several")
    for kind, path in named.items():
        return [open_target(path, kind=kind, config=config)]
    if not run_dirs:
        raise AuditError("no checkpoints given: pass --checkpoints RUN_DIR [RUN_DIR ...] "
                         "(run directories written by train.py) or --muddpythia HF_DIR")
    return [open_target(d, config=config) for d in run_dirs]


def combine_dirs(audit_dirs: Sequence[str], out: str | None = None) -> dict:
    """Combine audits run apart (audit.py ``--out`` directories, e.g. one per seed as each
    finished training) into one checkpoint-level audit; writes ``out`` like an audit."""
    from dynjax.audit import report

    parts = []
    for d in audit_dirs:
        path = os.path.join(d, "results.json")
        try:
            with open(path) as f:
                parts.append(json.load(f))
        except (OSError, ValueError) as e:
            raise AuditError(f"cannot read {path} ({e.__class__.__name__}); pass directories "
                             "written by audit.py --out") from None
    if not parts:
        raise AuditError("--combine needs the audit directories to combine")
    results = combine_stored(parts)
    results["meta"]["command"] = command_line()
    if out and distributed.is_main():
        report.write_report(results, out)
    return results


def placement_of(config) -> Placement:
    """The audit config's ``sharding`` (mesh and rules, as train.py's) over every device of
    every process; without that section, every device on the data axis."""
    sc = config.get("sharding")
    return Placement(sharding.make_mesh(sc), sharding.rules_of(sc) if sc is not None
                     else sharding.DEFAULT_RULES)


def audit_targets(targets: Sequence[dict], calib_windows, eval_windows, settings: Settings,
                  title: str, meta: dict | None = None, progress: bool = True,
                  engines: dict | None = None, task: Task = LM,
                  placement: Placement | None = None, sites=None) -> dict:
    """Audit every target (one checkpoint each) on the same windows; the results dict.

    A target is ``{"apply_fn", "schema", "params", "info": {...}}`` and optionally
    ``"logical_axes"`` (the model's, for ``placement``'s rules) and ``"facts"`` (what
    conditions need to know of the model, e.g. ``{"top_k": 2}``); targets that share an
    ``engine_key`` share one compiled Engine (pass ``engines``, a dict, to keep them across
    calls). ``task`` says what a window is and how it is scored (:data:`LM`, :data:`CLASSIFY`).
    Conditions that cannot apply to the schema are skipped and reported (:func:`applicable`).
    ``placement`` runs every engine under a device mesh (:class:`Placement`).
    ``sites`` (None: the conditions act on every coefficient together, one table): the
    coefficient families to intervene on (a comma-separated string, "all", or a sequence;
    :mod:`dynjax.audit.families`; a target's ``"families"`` groups top-level keys under one
    name); the main table acts on them together, the other families replayed as recorded,
    and with more than one, ``results["families"]`` holds one table per family.
    """
    from tqdm.auto import tqdm

    eval_windows, calib_windows = task.prepare(eval_windows), task.prepare(calib_windows)
    spec = window_spec(eval_windows)
    if window_spec(calib_windows) != spec:
        raise AuditError(f"calibration windows have shapes {window_spec(calib_windows)} but "
                         f"evaluation windows {spec}; use one seq_len / input size")
    if len({schema_signature(t["schema"]) for t in targets}) > 1:
        raise AuditError("the checkpoints have different coefficient schemas; audit one "
                         "model family and variant per run")
    facts = targets[0].get("facts", {})
    schema = targets[0]["schema"]
    only, per_family = None, {}
    if sites is not None:
        fams = families_lib.of_schema(schema, targets[0].get("families"))
        chosen = families_lib.select(fams, sites)
        if len(chosen) < len(fams):
            only = families_lib.keys_of(chosen)
        if len(chosen) > 1:
            for fam, keys in chosen.items():
                fs, fskip = applicable(settings, families_lib.sub(schema, keys), task, facts)
                per_family[fam] = (keys, fs, fskip)
    settings, skipped = applicable(settings, families_lib.sub(schema, only), task, facts)
    n_eval, n_calib = n_windows(eval_windows), n_windows(calib_windows)
    rows = min(settings.batch_size, n_eval, n_calib)
    engines = {} if engines is None else engines
    engine_of = []
    for t in targets:
        key = (t.get("engine_key", id(t)), rows, str(spec), task.name, id(placement))
        if key not in engines:
            engines[key] = Engine(t["apply_fn"], t["schema"], rows, spec, task, placement,
                                  facts)
        engine_of.append(engines[key])
    total = 0
    for t, eng in zip(targets, engine_of):
        total += eng.forward_count(n_eval, n_calib, settings, eng.cache_bytes(t["params"], n_eval),
                                   [fs for _, fs, _ in per_family.values()])
    bar = tqdm(total=total, desc="audit forwards", unit="fwd", disable=not progress,
               mininterval=1)
    ckpts = []
    try:
        for t, eng in zip(targets, engine_of):
            bar.set_postfix_str(t["info"].get("name", ""))
            params = eng.place_params(t["params"], t.get("logical_axes"))
            ckpts.append(audit_checkpoint(
                eng, params, calib_windows, eval_windows, settings, bar=bar, only=only,
                families={f: (keys, fs) for f, (keys, fs, _) in per_family.items()}))
            del params
    finally:
        bar.close()
    meta = dict(meta or {})
    shapes = {"seq_len": int(spec.shape[0])} if task is LM else {
        "window_shapes": jax.tree.map(lambda s: list(s.shape), spec)}
    if facts:
        meta["facts"] = dict(facts)
    if sites is not None:
        meta["sites"] = {"intervened": list(only or families_lib.keys_of(
            families_lib.of_schema(schema, targets[0].get("families")))),
            "families": {f: list(keys) for f, (keys, _, _) in per_family.items()}}
    if "token_identity" in settings.conditions:
        meta["token_identity"] = {
            "singleton_fraction": interventions.singleton_fraction(eval_windows),
            "note": "positions whose token id occurs nowhere else in the evaluation windows "
                    "keep their own coefficients"}
    meta["windows"] = {**shapes, "calibration": n_calib, "evaluation": n_eval,
                       "calibration_sha256": windows_sha256(calib_windows),
                       "evaluation_sha256": windows_sha256(eval_windows),
                       **meta.get("windows", {})}
    results = assemble_results(title, ckpts, [t["info"] for t in targets], settings,
                               schema, meta, not_applicable=skipped, task=task,
                               families=per_family)
    for fam, note in targets[0].get("site_notes", {}).items():   # said beside its numbers
        if fam in results.get("families", {}):
            results["families"][fam]["note"] = note
    return results


# ------------------------------------------------------------------------------ printing

def verdict_table(results: dict) -> str:
    """A short plain-text table: condition, ΔNLL, CI, p, retention, verdicts; then effects;
    then one such table per coefficient family audited apart (``results["families"]``)."""
    lines = [results["title"],
             f"unit: {results['unit']}; loss: {results.get('loss', LM.description)}",
             f"replay: {replay_status(results['replay'])}, NLL {results['replay']['nll']:.6f}"]
    lines += _condition_lines(results["conditions"], results.get("effects", {}))
    for fam, table in (results.get("families") or {}).items():
        lines += ["", f"family {fam} ({', '.join(table['sites'])}; the other coefficients "
                  "replayed as recorded)"] + ([f"note: {table['note']}"] if table.get("note")
                                              else [])
        lines += _condition_lines(table["conditions"], table.get("effects", {}))
    return "\n".join(lines)


def _condition_lines(conditions: dict, effects: dict) -> list[str]:
    fmt = lambda v, f="{:+.6f}": "—" if v is None or not np.isfinite(v) else f.format(v)
    lines = [f"{'condition':<20} {'ΔNLL':>10} {'95% CI':>25} {'p':>8}  retention / verdict"]
    for name, r in conditions.items():
        ci = f"[{fmt(r['ci_low'])}, {fmt(r['ci_high'])}]"
        extra = ""
        if r.get("retention"):
            extra = f"retention {fmt(r['retention']['estimate'], '{:.2%}')} " \
                    f"[{fmt(r['retention']['ci_low'], '{:.2%}')}, " \
                    f"{fmt(r['retention']['ci_high'], '{:.2%}')}]"
        if r.get("not_applicable"):
            extra = f"not applicable: {r['not_applicable']}"
        for vname, v in (r.get("verdicts") or {}).items():
            met = {True: "MET", False: "not met", None: "undetermined"}[v["met"]]
            extra += f"; {vname}: {met}"
        lines.append(f"{r.get('label', name):<20} {fmt(r['estimate']):>10} {ci:>25} "
                     f"{fmt(r.get('p'), '{:.3g}'):>8}  {extra}")
    for name, e in effects.items():
        if e.get("not_applicable"):
            lines.append(f"{name:<20} {'—':>10} not applicable: {e['not_applicable']}")
            continue
        lines.append(f"{name:<20} {fmt(e['estimate']):>10} "
                     f"{'[' + fmt(e['ci_low']) + ', ' + fmt(e['ci_high']) + ']':>25} "
                     f"{fmt(e.get('p'), '{:.3g}'):>8}  Holm p {fmt(e.get('p_holm'), '{:.3g}')}")
    return lines
