"""An audit's inputs from disk: run directories (opened through :mod:`dynjax.rundir`,
never the trainer) or a MUDDPythia HF directory as targets (apply_fn, schema, params,
logical_axes, info),
and calibration / evaluation windows of their data. Kept apart from the engine so file
formats stay out of it; failures are AuditErrors that name the fix."""
from __future__ import annotations

import functools
import json
import pathlib
from typing import Sequence

import jax
import numpy as np

from dynjax import gate_schedule, rundir
from dynjax.audit import interventions
from dynjax.audit.engine import keys_per_chunk
from dynjax.audit.settings import AuditError, Settings, params_sha256
from dynjax.coeffs import is_axes


def _opt(cfg, name, default=None):
    """``cfg.name`` if the field exists and is set, else ``default``."""
    v = cfg.get(name, None) if cfg is not None else None
    return default if v is None or v == "" else v


def is_classifier_run(config) -> bool:
    """Classifier runs (DynamicGate-MLP and its baselines): see :mod:`dynjax.rundir`."""
    return rundir.is_classifier(config)


family_variant = rundir.family_variant


@functools.lru_cache(maxsize=2)
def _tabular(dataset: str, data_dir, tfds_input_key=None, tfds_label_key="label"):
    from dynjax.data import tabular
    try:
        return tabular.load(dataset, data_dir, tfds_input_key, tfds_label_key)
    except tabular.DataError as e:
        raise AuditError(str(e)) from None


def _run_splits(config):
    """A classifier run's data (cached: the model's sizes and the windows both need it)."""
    return _tabular(config.data.dataset, config.data.get("data_dir"),
                    *rundir.tfds_keys(config.data))


def classifier_model(config):
    """The GatedMLP of a classifier run (input and class counts come from its dataset)."""
    return rundir.model_of(config, _run_splits(config))


def _open(run_dir, config) -> rundir.Run:
    try:
        return rundir.load(run_dir, splits=_run_splits(config) if is_classifier_run(config)
                           else None)
    except FileNotFoundError as e:
        raise AuditError(str(e)) from None


def load_classifier(run_dir, config):
    """``(apply_fn, params, step, schedule)`` of a classifier run at its latest checkpoint.

    The gates run at the schedule of that step (tau, theta, gates forced open in warm-up),
    i.e. the function the run's own evaluation measured; hard masks are re-thresholded from
    the (replayed) gate probabilities.
    """
    apply_fn, _, params, step, sched = _load_classifier(run_dir, config)
    return apply_fn, params, step, sched


def _load_classifier(run_dir, config):
    """:func:`load_classifier`'s values with the model after the apply_fn."""
    run = _open(run_dir, config)
    sched = gate_schedule.apply_settings(config, run.step)
    return (functools.partial(run.model.apply, **sched), run.model, run.params,
            int(run.step), sched)


def load_run_targets(run_dirs: Sequence[str]) -> tuple[list[dict], list]:
    """One target per run directory written by train.py; (targets, configs).

    Checks, before loading any parameters, that each directory exists, is a dynjax run, and
    holds a model that records coefficients.
    """
    if not run_dirs:
        raise AuditError("no checkpoints given: pass --checkpoints RUN_DIR [RUN_DIR ...] "
                         "(run directories written by train.py) or --muddpythia HF_DIR")
    configs = []
    for d in run_dirs:
        p = pathlib.Path(d)
        if not p.is_dir():
            raise AuditError(f"run directory {d} does not exist; train one first, e.g. "
                             f"`python train.py --config=configs/tiny.py:feature_gate "
                             f"--workdir={d}`, or pass an existing run directory")
        try:
            config = rundir.read_config(d)
        except FileNotFoundError as e:
            raise AuditError(str(e)) from None
        model = (classifier_model(config) if is_classifier_run(config)
                 else rundir.model_of(config))
        if not jax.tree.leaves(model.schema, is_leaf=is_axes):
            family, variant = family_variant(config)
            raise AuditError(
                f"{d} holds a {variant!r} {family} model, which records no coefficients: "
                "there is nothing to audit. Audit a variant with coefficients (uniform, "
                "layer_static, feature_gate; mod, moe, mode_*; dgate, structured) or MUDDPythia")
        configs.append(config)

    def same(what, key):
        values = {json.dumps(key(c), sort_keys=True) for c in configs}
        if len(values) > 1:
            raise AuditError(f"the checkpoints differ in {what} ({sorted(values)}); audit the "
                             "seeds of one model and data configuration together")
    same("data.seq_len", lambda c: c.data.get("seq_len"))
    same("model family and variant", family_variant)
    same("training data", lambda c: [c.data.get(k) for k in ("source", "path", "tfds_name",
                                                             "dataset")])
    targets = []
    for d, config in zip(run_dirs, configs):
        extra = {}
        if is_classifier_run(config):
            apply_fn, model, params, step, sched = _load_classifier(d, config)
            extra["gate_schedule"] = sched
            key = [config.model.to_dict(), sched]
        else:
            run = _open(d, config)
            model, params, step = run.model, run.params, run.step
            apply_fn, key = model.apply, config.model.to_dict()
        family, variant = family_variant(config)
        info = {"name": pathlib.Path(d).resolve().name, "run_dir": str(pathlib.Path(d).resolve()),
                "step": int(step), "seed": int(config.seed), "family": family,
                "variant": variant, "params_sha256": params_sha256(params),
                "n_params": int(sum(np.size(x) for x in jax.tree.leaves(params))), **extra}
        eval_path = pathlib.Path(d) / "eval.json"
        if eval_path.exists():
            info["train_eval"] = json.loads(eval_path.read_text())
        else:
            info["note"] = (f"{d} has no eval.json (training unfinished?): auditing its latest "
                            f"checkpoint, step {step}")
        targets.append({"apply_fn": apply_fn, "schema": model.schema, "params": params,
                        "logical_axes": model.logical_axes, "info": info,
                        "engine_key": json.dumps(key, sort_keys=True)})
    return targets, configs


def _resolve_seq_len(requested, trained: int, what: str) -> int:
    if requested is None:
        return trained
    if int(requested) != trained:
        raise AuditError(f"{what} was trained with data.seq_len={trained} but the audit asks "
                         f"for data.seq_len={requested}; drop the override (the audit uses the "
                         f"checkpoint's) or set --config.data.seq_len={trained}")
    return trained


def _windows(name: str, split, seq_len: int, n: int, notes: list) -> np.ndarray:
    from dynjax.data import text

    w = text.eval_windows(np.asarray(split), seq_len, n)
    if len(w) < n:
        notes.append(f"{name}: {len(w)} non-overlapping windows of {seq_len} tokens available, "
                     f"{n} requested")
    return w


def run_windows(data_cfg, run_config, seq_len: int, n_calib: int, n_eval: int):
    """Calibration windows from the validation split, evaluation windows from test (disjoint
    by construction), from the data the run was trained on unless the audit config overrides."""
    from dynjax.data import text

    src = dict(source=_opt(data_cfg, "source", run_config.data.source),
               path=_opt(data_cfg, "path", run_config.data.get("path")),
               tfds_name=_opt(data_cfg, "tfds_name", run_config.data.get("tfds_name")),
               data_dir_=_opt(data_cfg, "data_dir", run_config.data.get("data_dir")))
    splits = text.load_splits(**src)
    notes = []
    calib = _windows("calibration (validation split)", splits["validation"], seq_len, n_calib,
                     notes)
    ev = _windows("evaluation (test split)", splits["test"], seq_len, n_eval, notes)
    info = {"source": src["source"], "path": src["path"], "tfds_name": src["tfds_name"],
            "calibration_split": "validation", "evaluation_split": "test", "notes": notes}
    return calib, ev, info


def classifier_windows(data_cfg, run_config, n_calib: int, n_eval: int, seed: int = 0):
    """Calibration examples from the validation split, evaluation examples from test (one
    window = one labelled example). A fixed-seed random subset of each split, since a split
    may be sorted by class (mnist5k's is)."""
    dataset = _opt(data_cfg, "dataset", run_config.data.dataset)
    data_dir = _opt(data_cfg, "data_dir", run_config.data.get("data_dir"))
    splits = _tabular(dataset, data_dir, *rundir.tfds_keys(run_config.data))
    notes, out = [], []
    for name, split, n in (("calibration (validation split)", "validation", n_calib),
                           ("evaluation (test split)", "test", n_eval)):
        x, y = splits[split]
        if len(x) < n:
            notes.append(f"{name}: {len(x)} examples available, {n} requested")
        idx = np.random.default_rng([seed, len(out)]).permutation(len(x))[:n]
        out.append({"x": x[idx], "y": y[idx]})
    info = {"dataset": dataset, "calibration_split": "validation", "evaluation_split": "test",
            "subset": f"numpy default_rng([{seed}, 0 | 1]) permutation, first n", "notes": notes}
    return out[0], out[1], info


def _read_text(path) -> str:
    p = pathlib.Path(path).expanduser()
    if not p.is_file():
        raise AuditError(f"text file {path} does not exist; point data.validation_path and "
                         "data.test_path at WikiText-style files (e.g. wiki.valid.raw, "
                         "wiki.test.raw) or data.path at one text file")
    return p.read_text("utf-8", errors="replace")


def muddpythia_windows(data_cfg, tokenizer, vocab_size: int, seq_len: int, n_calib: int,
                       n_eval: int):
    """Token windows for MUDDPythia from local text: WikiText-style validation and test files
    (``data.validation_path`` / ``data.test_path``), or one file or folder (``data.path``)
    cut 90/5/5 into non-overlapping splits. Tokenized with the checkpoint's tokenizer.json;
    without one, bytes are the tokens (only for byte-vocabulary models)."""
    from dynjax.data import text

    val_path, test_path = _opt(data_cfg, "validation_path"), _opt(data_cfg, "test_path")
    if val_path and test_path:
        texts = {"validation": _read_text(val_path), "test": _read_text(test_path)}
        src = {"validation_path": str(val_path), "test_path": str(test_path)}
    elif _opt(data_cfg, "path"):
        splits = text.load_splits("files", str(data_cfg.path))
        texts = {k: splits[k].tobytes().decode("utf-8", "replace") for k in ("validation", "test")}
        src = {"path": str(data_cfg.path), "split": "90/5/5 of each document"}
    else:
        raise AuditError("MUDDPythia needs local text: set --config.data.validation_path and "
                         "--config.data.test_path (e.g. wikitext-103-raw/wiki.valid.raw and "
                         "wiki.test.raw) or --config.data.path=FILE_OR_FOLDER")

    def encode(t):
        if tokenizer is not None:
            return np.asarray(tokenizer.encode(t).ids, np.int32)
        if vocab_size < 256:
            raise AuditError(f"the checkpoint directory has no tokenizer.json and its vocabulary "
                             f"({vocab_size}) is not bytes; copy the model's tokenizer.json "
                             "into it (pip install tokenizers)")
        return np.frombuffer(t.encode("utf-8"), np.uint8).astype(np.int32)

    notes = []
    calib = _windows("calibration (validation)", encode(texts["validation"]), seq_len, n_calib,
                     notes)
    ev = _windows("evaluation (test)", encode(texts["test"]), seq_len, n_eval, notes)
    src.update(tokenizer="tokenizer.json" if tokenizer is not None else "bytes", notes=notes)
    return calib, ev, src


def muddpythia_plan(path: str, dtype: str, seq_len: int, n_calib: int, n_eval: int,
                    settings: Settings, flops_per_second=None) -> dict:
    """Memory and time estimate of a MUDDPythia audit, from config.json alone (no weights)."""
    from dynjax.loaders import muddpythia_hf
    from dynjax.models import muddpythia

    cfg_path = pathlib.Path(path) / "config.json"
    if not cfg_path.exists():
        return {}
    cfg = muddpythia_hf.config_from_hf(json.loads(cfg_path.read_text()), dtype=dtype)
    rows = min(settings.batch_size, n_calib, n_eval)
    est = muddpythia.memory_time_estimate(cfg, n_eval, seq_len, rows, flops_per_second)
    n_rand = sum(interventions.CONDITIONS[c].randomized for c in settings.conditions)
    n_det = sum(not interventions.CONDITIONS[c].randomized for c in settings.conditions) - 1
    replays = n_eval * (1 + n_det + n_rand * settings.reassignments)
    calib_cache = est["coeff_cache_bytes"] * n_calib // max(n_eval, 1)
    per = keys_per_chunk(settings.reassignments, est["coeff_cache_bytes"] * max(n_rand, 1),
                          settings.max_reassign_bytes)
    plan = {
        "model": {"n_layer": cfg.n_layer, "dim": cfg.dim, "dtype": cfg.dtype,
                  "params": est["param_count"]},
        "windows": {"calibration": n_calib, "evaluation": n_eval, "seq_len": seq_len,
                    "rows_per_forward": rows},
        "forward_windows": {"record": n_eval + n_calib, "replay": replays},
        "bytes": {"params": est["param_bytes"],
                  "coeff_cache_eval_plus_calib": est["coeff_cache_bytes"] + calib_cache,
                  "reassigned_copies": per * n_rand * est["coeff_cache_bytes"],
                  "activations_per_batch": est["activation_bytes_per_batch"]},
        "flops": (est["record_flops_per_window"] * (n_eval + n_calib)
                  + est["replay_flops_per_window"] * replays),
    }
    plan["bytes"]["peak_device_estimate"] = (
        est["param_bytes"] + plan["bytes"]["coeff_cache_eval_plus_calib"]
        + plan["bytes"]["reassigned_copies"] + 2 * est["activation_bytes_per_batch"])
    if flops_per_second:
        plan["seconds_estimate"] = plan["flops"] / float(flops_per_second)
    return plan


def format_plan(plan: dict) -> str:
    gb = lambda b: f"{b / 2**30:.2f} GiB"
    lines = [f"MUDDPythia audit plan: {plan['model']['n_layer']} layers, dim "
             f"{plan['model']['dim']}, {plan['model']['params'] / 1e9:.3f}B params, "
             f"{plan['model']['dtype']}",
             f"  windows: {plan['windows']['calibration']} calibration + "
             f"{plan['windows']['evaluation']} evaluation x {plan['windows']['seq_len']} tokens, "
             f"{plan['windows']['rows_per_forward']} rows per forward",
             f"  forwards (windows): record {plan['forward_windows']['record']}, "
             f"replay {plan['forward_windows']['replay']}; {plan['flops']:.3g} FLOP"]
    lines += [f"  {k.replace('_', ' ')}: {gb(v)}" for k, v in plan["bytes"].items()]
    if "seconds_estimate" in plan:
        lines.append(f"  time at the given FLOP/s: {plan['seconds_estimate'] / 60:.1f} min")
    else:
        lines.append("  time: set --config.muddpythia.flops_per_second for an estimate")
    return "\n".join(lines)


def load_muddpythia_target(path: str, dtype: str):
    """(target, cfg, tokenizer) for a local MUDDPythia HF directory."""
    from dynjax.loaders import muddpythia_hf
    from dynjax.models import build

    if not pathlib.Path(path).is_dir():
        raise AuditError(f"MUDDPythia directory {path} does not exist; download the checkpoint "
                         "(config.json, *.safetensors, tokenizer.json) to a local folder first")
    try:
        cfg, params, tokenizer = muddpythia_hf.load_hf_dir(str(path), dtype=dtype)
    except FileNotFoundError as e:
        raise AuditError(f"{e}; the directory needs config.json and the *.safetensors "
                         "weights") from None
    info = {"name": pathlib.Path(path).resolve().name, "run_dir": str(pathlib.Path(path).resolve()),
            "family": "muddpythia", "variant": "muddpythia", "dtype": cfg.dtype,
            "params_sha256": params_sha256(params),
            "n_params": int(sum(np.size(x) for x in jax.tree.leaves(params)))}
    model = build(cfg)
    target = {"apply_fn": model.apply, "schema": model.schema, "params": params, "info": info,
              "logical_axes": model.logical_axes, "engine_key": ("muddpythia", cfg)}
    return target, cfg, tokenizer
