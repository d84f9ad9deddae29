"""Calibration and evaluation windows of a checkpoint's data, disjoint by construction.

Each kind of checkpoint (:mod:`dynjax.audit.targets.kinds`) cuts its windows here: token windows of
the text a language-model run trained on, labelled examples of a classifier run's dataset,
or local text tokenized with an HF directory's own tokenizer. Each returns ``(calibration,
evaluation, info)``; ``info["notes"]`` says where fewer windows exist than were asked for.
"""
from __future__ import annotations

import functools
import pathlib

import numpy as np

from dynjax.runs import rundir
from dynjax.errors import AuditError


def opt(cfg, name, default=None):
    """``cfg.name`` if the field exists and is set, else ``default``."""
    v = cfg.get(name, None) if cfg is not None else None
    return default if v is None or v == "" else v


def resolve_seq_len(requested, trained: int, what: str) -> int:
    """The trained window length; an audit override must equal it."""
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


def text_run_windows(data_cfg, run_config, seq_len: int, n_calib: int, n_eval: int):
    """Calibration windows from the validation split, evaluation windows from test, of the
    data the run was trained on unless the audit config overrides it."""
    from dynjax.data import text

    src = dict(source=opt(data_cfg, "source", run_config.data.source),
               path=opt(data_cfg, "path", run_config.data.get("path")),
               tfds_name=opt(data_cfg, "tfds_name", run_config.data.get("tfds_name")),
               data_dir_=opt(data_cfg, "data_dir", run_config.data.get("data_dir")))
    splits = text.load_splits(**src)
    notes = []
    calib = _windows("calibration (validation split)", splits["validation"], seq_len, n_calib,
                     notes)
    ev = _windows("evaluation (test split)", splits["test"], seq_len, n_eval, notes)
    info = {"source": src["source"], "path": src["path"], "tfds_name": src["tfds_name"],
            "calibration_split": "validation", "evaluation_split": "test", "notes": notes}
    return calib, ev, info


@functools.lru_cache(maxsize=2)
def tabular_splits(dataset: str, data_dir, tfds_input_key=None, tfds_label_key="label"):
    """A classifier dataset's ``{split: (x, y)}`` (cached: the model's sizes and the
    windows both need it)."""
    from dynjax.data import tabular
    return tabular.load(dataset, data_dir, tfds_input_key, tfds_label_key)


def run_splits(config):
    """The data a classifier run was trained on."""
    return tabular_splits(config.data.dataset, config.data.get("data_dir"),
                          *rundir.tfds_keys(config.data))


def example_windows(data_cfg, run_config, n_calib: int, n_eval: int, seed: int = 0):
    """Calibration examples from the validation split, evaluation examples from test (one
    window = one labelled example). A fixed-seed random subset of each split, since a split
    may be sorted by class (mnist5k's is)."""
    dataset = opt(data_cfg, "dataset", run_config.data.dataset)
    data_dir = opt(data_cfg, "data_dir", run_config.data.get("data_dir"))
    splits = tabular_splits(dataset, data_dir, *rundir.tfds_keys(run_config.data))
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


def local_text(data_cfg, who: str) -> tuple[dict, dict]:
    """``({"validation": str, "test": str}, source info)`` from local text: WikiText-style
    validation and test files (``data.validation_path`` / ``data.test_path``), or one file
    or folder (``data.path``) cut 90/5/5 into non-overlapping splits."""
    from dynjax.data import text

    val_path, test_path = opt(data_cfg, "validation_path"), opt(data_cfg, "test_path")
    if val_path and test_path:
        texts = {"validation": _read_text(val_path), "test": _read_text(test_path)}
        return texts, {"validation_path": str(val_path), "test_path": str(test_path)}
    if opt(data_cfg, "path"):
        splits = text.load_splits("files", str(data_cfg.path))
        texts = {k: splits[k].tobytes().decode("utf-8", "replace") for k in ("validation", "test")}
        return texts, {"path": str(data_cfg.path), "split": "90/5/5 of each document"}
    raise AuditError(f"{who} needs local text: set --config.data.validation_path and "
                     "--config.data.test_path (e.g. wikitext-103-raw/wiki.valid.raw and "
                     "wiki.test.raw) or --config.data.path=FILE_OR_FOLDER")


def tokenized_windows(texts: dict, encode, seq_len: int, n_calib: int, n_eval: int):
    """``(calibration, evaluation, notes)``: non-overlapping windows of the validation and
    test texts after ``encode(str) -> int32 ids``."""
    notes = []
    calib = _windows("calibration (validation)", encode(texts["validation"]), seq_len, n_calib,
                     notes)
    ev = _windows("evaluation (test)", encode(texts["test"]), seq_len, n_eval, notes)
    return calib, ev, notes
