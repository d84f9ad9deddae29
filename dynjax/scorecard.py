"""The execution scorecard: three questions about one trained checkpoint, side by side.

The audit paper keeps three properties of a dynamic model apart; the scorecard answers each
for any checkpoint dynjax can load, with a one-line verdict whose threshold lives in
``configs/scorecard.py``:

- *variation*: do the coefficients change with input and position? The audit's variance
  decomposition (shares of layer / example / token / remainder), each leaf's range, and
  for routers the fraction of tokens entering or the routing entropy.
- *functional dependence*: does the fixed model's output depend on them? The audit's ΔNLL
  for cross-input, token shuffle, the static profile and the structure-removed reference,
  with intervals, and LayerMean retention — reused from ``dynjax.audit``, not recomputed.
- *execution*: does it run less? Executed blocks per token relative to all blocks, FLOPs
  relative to the same-size dense model (compiled and analytic), measured forward,
  prefill and per-token decode latency and throughput relative to that dense model at
  batch 1 and 8, KV-cache bytes.

Checkpoints without coefficients (dense, fixed_depth) have no variation or dependence to
report; they get the execution panel only. Two other kinds of checkpoint get the same three
panels with their own execution question:

- DynamicGate-MLP classifiers (``train.py`` runs of ``configs/dgmlp_*.py``): open units
  per example, RelMAC, and the FLOPs and latency of the masked forward (and of the
  structured variant's open-blocks path) against the dense MLP of the same widths
  (``dynjax.measure.mlp_execution``);
- MUDDPythia HF directories: every block runs for every token; FLOPs and latency against
  the same weights with static mixing (each layer's ``dense_bs`` bias, no DA MLP).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dynjax.measure import execution, latency
from dynjax.models import build
from dynjax.models.transformer import ModelConfig

PANEL_CONDITIONS = ("cross_input", "token_shuffle", "static_profile", "structure_removed")


def dense_twin(cfg: ModelConfig) -> ModelConfig:
    """The same-size dense decoder a dynamic model's execution is compared with."""
    if cfg.family in ("gates", "mod"):
        return cfg.replace(variant="dense")
    return ModelConfig(family="gates", variant="dense", vocab_size=cfg.vocab_size,
                       d_model=cfg.d_model, n_heads=cfg.n_heads, n_layers=cfg.n_layers,
                       d_ff=cfg.d_ff, dtype=cfg.dtype, scan_layers=cfg.scan_layers)


# ------------------------------------------------------------------------------ panels

INPUT_AXES = ("example", "token")


def input_share(x, names) -> float:
    """Share of a coefficient leaf's variance left after removing its static profile (the
    mean over examples and tokens of each layer / stream / source / expert cell): what
    varies with the input and position. Static structure (a layer profile, an expert or
    source pattern, their interactions) counts as not varying."""
    x = np.asarray(x, np.float64)
    axes = tuple(i for i, n in enumerate(names) if n in INPUT_AXES)
    total = float(np.sum((x - x.mean()) ** 2))
    if total == 0.0 or not axes:
        return 0.0
    return float(np.sum((x - x.mean(axis=axes, keepdims=True)) ** 2)) / total


def variation(audit: dict, coeffs: dict, cfg, schema=None, family: str | None = None) -> dict:
    """Variance shares from the audit, each leaf's input-varying share and range, and
    routing summaries, from recorded coeffs. ``family`` defaults to ``cfg.family`` (the
    decoders'; a GatedMLP or MUDDPythia config has none)."""
    family = family or cfg.family
    from dynjax.coeffs import is_axes
    out = {"variance": audit.get("variance", {}), "ranges": {}, "input_share": {}}
    if schema is not None:
        pairs = zip(jax.tree_util.tree_flatten_with_path(coeffs)[0],
                    jax.tree.leaves(schema, is_leaf=is_axes))
        out["input_share"] = {jax.tree_util.keystr(path): input_share(x, axes.names)
                              for (path, x), axes in pairs}
    for name, leaf in coeffs.items():
        leaves = leaf if isinstance(leaf, list) else [leaf]
        vals = np.concatenate([np.asarray(v, np.float64).ravel() for v in leaves])
        out["ranges"][name] = {"min": float(vals.min()), "max": float(vals.max()),
                               "std": float(vals.std())}
    if family == "mod" and "router" in coeffs:
        out["entered_fraction_topk"] = cfg.mod.capacity
        ask = coeffs.get("predictor", coeffs["router"])
        out["asks_to_enter_fraction"] = float(np.mean(np.asarray(ask) > 0))
    if family in ("moe", "gated_mlp") and "router" in coeffs:  # MoE, or the MLP's Switch-MoE
        leaves = coeffs["router"] if isinstance(coeffs["router"], list) else [coeffs["router"]]
        ent = [_entropy(np.asarray(p, np.float64)) for p in leaves]
        out["routing_entropy_nats"] = float(np.mean([e.mean() for e in ent]))
        out["routing_entropy_max_nats"] = float(np.log(np.shape(leaves[0])[-1]))
    return out


def _entropy(p):
    return -np.sum(p * np.log(np.clip(p, 1e-12, None)), axis=-1)


def dependence(audit: dict) -> dict:
    """The audit's ΔNLL rows the scorecard shows, and the static profile's retention."""
    rows = {}
    for name in PANEL_CONDITIONS:
        r = audit["conditions"].get(name)
        if r is None or r.get("not_applicable"):
            continue
        rows[name] = {k: r[k] for k in ("estimate", "ci_low", "ci_high", "p", "label")
                      if k in r}
    ret = audit["conditions"].get("static_profile", {}).get("retention")
    return {"conditions": rows, "retention": ret, "unit": audit.get("unit"),
            "replay": audit["replay"]["exact"]}


def execution_panel(cfg: ModelConfig, params, windows, batches=(1, 8), repeats: int = 5) -> dict:
    """Executed blocks, FLOPs, KV-cache bytes and measured forward / prefill / decode
    latency relative to the dense twin, the two models' timers taking turns in one run
    (``dynjax.measure.latency``; timing inputs are random tokens of the window length)."""
    from dynjax import decoding
    model, twin_cfg = build(cfg), dense_twin(cfg)
    twin = build(twin_cfg)
    T = windows.shape[1]
    tokens = jnp.asarray(windows[:max(batches)])
    counts = execution.executed_blocks(model, params, tokens)
    flops = execution.flop_report(cfg, 1, T)
    twin_flops = execution.flop_report(twin_cfg, 1, T)
    twin_params = twin.init(jax.random.key(0), tokens[:1])
    kv = lambda c: decoding.cache_bytes(decoding.init_cache(c, 1, T))
    out = {"executed_blocks_per_token": float(np.mean(counts)), "n_layers": cfg.n_layers,
           "executed_fraction": float(np.mean(counts)) / cfg.n_layers,
           "flops_ratio_compiled": flops["compiled_flops"] / twin_flops["compiled_flops"],
           "flops_ratio_analytic": flops["analytic_flops"] / twin_flops["analytic_flops"],
           "kv_cache_bytes_ratio": kv(cfg) / kv(twin_cfg),
           "dense_twin": f"{twin_cfg.family}/{twin_cfg.variant}", "latency": {},
           "load_average": latency.load_average()}
    timers = {}
    for who, (c, p) in {"model": (cfg, params), "dense": (twin_cfg, twin_params)}.items():
        timers.update({f"{who}/{k}": f for k, f in latency.model_timers(c, p, T, batches).items()})
    med = latency.paired_medians(timers, repeats)
    mine = {k.split("/", 1)[1]: v for k, v in med.items() if k.startswith("model/")}
    rate = latency.rates(mine, T)
    for name, s in mine.items():
        out["latency"][name] = {"seconds": s, "dense_seconds": med[f"dense/{name}"],
                                "ratio": s / med[f"dense/{name}"], "tokens_per_s": rate[name]}
    return out


def _latency_rows(med: dict, program: str, baseline: str, batches, per_call) -> dict:
    """``forward_b{b}`` rows of ``program`` against ``baseline`` from paired medians keyed
    ``{who}/forward_b{b}``; ``per_call(b)`` is (items per call, what an item is)."""
    rows = {}
    for b in batches:
        s, base = med[f"{program}/forward_b{b}"], med[f"{baseline}/forward_b{b}"]
        n, item = per_call(b)
        rows[f"forward_b{b}"] = {"seconds": s, "dense_seconds": base, "ratio": s / base,
                                 f"{item}_per_s": n / s}
    return rows


def classifier_execution_panel(model, params, x, settings: dict, batches=(1, 8),
                               repeats: int = 50) -> dict:
    """A GatedMLP's open units per example (RelMAC), and its forward's FLOPs and latency
    against the dense MLP of the same widths; a structured model's open-blocks path beside
    it under ``structured``. ``x``: test examples (RelMAC over all, timing on the first
    max(batches)); ``settings``: the gate schedule at the checkpoint's step."""
    from dynjax.measure import mlp_execution
    cfg = model.cfg
    units = mlp_execution.open_units(model, params, jnp.asarray(x), settings)
    analytic = mlp_execution.analytic_flops(cfg, units)
    compiled = mlp_execution.compiled_flops(cfg, params, settings)
    med = latency.paired_medians(mlp_execution.timers(cfg, params, x, settings, batches),
                                 repeats)

    def program(name):
        return {"flops_ratio_compiled": compiled[name] / compiled["dense"],
                "flops_ratio_analytic": analytic[name] / analytic["dense"],
                "latency": _latency_rows(med, name, "dense", batches, lambda b: (b, "examples"))}
    out = {"kind": "units", **program("model"), "relmac": units["relmac"],
           "open_units_per_example": units["open_units_per_example"], "units": units["units"],
           "executed_fraction": units["executed_fraction"],
           "compiled_flops_per_example": compiled, "analytic_flops_per_example": analytic,
           "dense_twin": "gated_mlp/dense " + "-".join(map(str, model.dims)),
           "load_average": latency.load_average()}
    if "structured" in compiled:
        out["structured"] = program("structured")
    return out


def muddpythia_execution_panel(cfg, params, windows, batches=(1, 8), repeats: int = 5) -> dict:
    """MUDDPythia runs every block for every token (no skipping); its forward's FLOPs
    (compiled, and analytic from ``muddpythia.memory_time_estimate``) and latency, timed in
    turns, against ``muddpythia.apply_static_mixing``: the same weights, no DA MLP."""
    from dynjax.models import muddpythia
    T = windows.shape[1]
    programs = {"model": lambda p, t: muddpythia.apply(cfg, p, t)[0],
                "static": lambda p, t: muddpythia.apply_static_mixing(cfg, p, t)[0]}
    one = jnp.asarray(windows[:1])
    compiled = {k: execution.compiled_cost(f, params, one)["flops"] for k, f in programs.items()}
    est = muddpythia.memory_time_estimate(cfg, 1, T, 1)
    timers = {}
    for name, f in programs.items():
        jitted = jax.jit(f)
        for b in batches:
            tokens = jnp.asarray(windows[:b])
            timers[f"{name}/forward_b{b}"] = lambda f=jitted, t=tokens: f(params, t)
    med = latency.paired_medians(timers, repeats)
    return {"kind": "mixing", "executed_blocks_per_token": float(cfg.n_layer),
            "n_layers": cfg.n_layer, "executed_fraction": 1.0,
            "flops_ratio_compiled": compiled["model"] / compiled["static"],
            "flops_ratio_analytic": est["record_flops_per_window"]
            / est["static_mixing_flops_per_window"],
            "compiled_flops": compiled,
            "dense_twin": "the same weights with static mixing (dense_bs only, no DA MLP)",
            "baseline": "static mixing",
            "latency": _latency_rows(med, "model", "static", batches,
                                     lambda b: (b * T, "tokens")),
            "load_average": latency.load_average()}


# ---------------------------------------------------------------------------- verdicts

def verdicts(card: dict, th) -> dict:
    """One line per axis; the thresholds are ``th`` (configs/scorecard.py)."""
    out = {}
    var = card.get("variation")
    if var is None:
        out["variation"] = "no coefficients: nothing varies"
    else:
        share = max(var["input_share"].values(), default=float("nan"))
        out["variation"] = (f"varies (up to {share:.1%} of the variance is not its static "
                            "profile)" if share >= th.varies_min_input_share else
                            f"nearly static (its static profile explains {1 - share:.1%})")
    dep = card.get("dependence")
    if dep is None:
        out["dependence"] = "no coefficients: nothing to depend on"
    else:
        lows = {k: r["ci_low"] for k, r in dep["conditions"].items()
                if k in ("cross_input", "static_profile")}
        strongest = max(lows, key=lows.get) if lows else None
        if strongest and lows[strongest] > th.depends_min_dnll:
            out["dependence"] = (f"function depends on it ({dep['conditions'][strongest]['label']}"
                                 f" costs {dep['conditions'][strongest]['estimate']:+.4f} nats,"
                                 f" CI low {lows[strongest]:+.4f})")
        else:
            out["dependence"] = (f"little dependence (no reassignment's CI lower bound above "
                                 f"{th.depends_min_dnll} nats)")
    ex = card["execution"]
    lines = [_execution_verdict(ex, th, ex.get("baseline", "dense"), "")]
    if "structured" in ex:   # a faster program of the same model counts where it exists
        lines.append(_execution_verdict(ex["structured"], th, "dense", " on its open-blocks path"))
    out["execution"] = min(lines, key=_rank)   # the model's own program wins ties
    return out


VERDICT_ORDER = ("executes less", "saves FLOPs but not time", "no skipping")


def _rank(line: str) -> int:
    return next(i for i, p in enumerate(VERDICT_ORDER) if line.startswith(p))


def _execution_verdict(ex: dict, th, baseline: str, where: str) -> str:
    lat = ex["latency"].get(f"forward_b{th.latency_batch}", {}).get("ratio", float("nan"))
    saves = ex["flops_ratio_compiled"] <= th.executes_less_max_ratio
    faster = lat <= th.executes_less_max_ratio
    what = (f"executes {ex['flops_ratio_compiled']:.2f}x the FLOPs and runs {lat:.2f}x the "
            f"time of {baseline}{where} (forward, batch {th.latency_batch})")
    return ("executes less: " + what if saves and faster else
            "saves FLOPs but not time: " + what if saves else "no skipping: " + what)


# ----------------------------------------------------------------------------- program

def score(path: str, config, out_dir, log=print) -> dict:
    """The scorecard of one checkpoint: a train.py run directory (language model or
    classifier) or a MUDDPythia HF directory."""
    from dynjax import rundir
    from dynjax.loaders import muddpythia_hf

    if muddpythia_hf.is_hf_dir(path):
        return score_muddpythia(path, config, out_dir, log)
    if rundir.is_classifier(rundir.read_config(path)):
        return score_classifier(path, config, out_dir, log)
    return score_run(path, config, out_dir, log)


def _audit(config_audit, out_dir, log, what: str, **where) -> dict:
    """The audit of ``where`` (run_dirs= or muddpythia_dir=), written under out_dir/audit."""
    from pathlib import Path

    from dynjax.audit import run as audit_run
    log(f"{what}: auditing ({config_audit.data.eval_windows} windows, "
        f"{config_audit.reassignments} reassignments)")
    return audit_run.audit_from_config(config_audit, out=str(Path(out_dir) / "audit"),
                                       progress=False, log=log, **where)


def _card(path, model_name: str, params) -> dict:
    return {"run": str(path), "model": model_name,
            "params": int(sum(np.prod(p.shape) for p in jax.tree.leaves(params)))}


def _finish(card: dict, config) -> dict:
    card["verdicts"] = verdicts(card, config.thresholds)
    card["thresholds"] = config.thresholds.to_dict()
    return card


def score_run(run_dir: str, config, out_dir, log=print) -> dict:
    """The scorecard of one train.py language-model run: audit (quick settings from
    ``config.audit``) for variation and dependence, then the execution panel; verdicts by
    ``config.thresholds``."""
    from dynjax import rundir
    from dynjax.data import text

    cfg_run, model, params = rundir.load_params(run_dir)
    cfg = model.cfg
    dc = cfg_run.data
    splits = text.load_splits(dc.source, dc.get("path"), dc.get("tfds_name"), dc.get("data_dir"))
    windows = text.eval_windows(splits["test"], dc.seq_len, int(config.execution_windows))
    card = _card(run_dir, f"{cfg.family}/{cfg.variant}", params)
    if model.schema:
        audit = _audit(config.audit, out_dir, log, run_dir, run_dirs=[run_dir])
        _, coeffs = jax.jit(model.apply)(params, jnp.asarray(windows))
        card["variation"] = variation(audit, coeffs, cfg, model.schema)
        card["dependence"] = dependence(audit)
    log(f"{run_dir}: timing against its dense twin")
    card["execution"] = execution_panel(cfg, params, windows, tuple(config.latency_batches),
                                        int(config.latency_repeats))
    return _finish(card, config)


def classifier_audit_config(config):
    """``config.audit`` with ``config.classifier_examples`` calibration and evaluation
    examples, all in one forward (a window is one example: 32 would give wide intervals),
    and no window length."""
    c = config.audit.copy_and_resolve_references()
    n = int(config.classifier_examples)
    c.data.calib_windows = c.data.eval_windows = c.batch_size = n
    c.data.seq_len = None   # a MUDDPythia's window length, when one is scored beside it
    c.per_window = False
    return c


def score_classifier(run_dir: str, config, out_dir, log=print) -> dict:
    """The scorecard of one DynamicGate-MLP (or baseline) classifier run: the audit on
    ``config.classifier_examples`` examples, variation of the unit gates / expert routing
    on the audit's evaluation examples, and :func:`classifier_execution_panel`; the gates
    run at the schedule of the checkpoint's step, as in the audit."""
    from dynjax import rundir
    from dynjax.audit import inputs

    audit_config = classifier_audit_config(config)
    config_run = rundir.read_config(run_dir)
    model = inputs.classifier_model(config_run)
    apply_fn, params, _, settings = inputs.load_classifier(run_dir, config_run)
    _, ev, _ = inputs.classifier_windows(audit_config.data, config_run, 0,
                                         int(config.classifier_examples))
    card = {**_card(run_dir, f"gated_mlp/{model.cfg.variant}", params), "gate_settings": settings}
    if model.schema:
        audit = _audit(audit_config, out_dir, log, run_dir, run_dirs=[run_dir])
        _, coeffs = jax.jit(apply_fn)(params, jnp.asarray(ev["x"]))
        card["variation"] = variation(audit, coeffs, model.cfg, model.schema, "gated_mlp")
        card["dependence"] = dependence(audit)
    log(f"{run_dir}: timing against the dense MLP")
    card["execution"] = classifier_execution_panel(
        model, params, ev["x"], settings, tuple(config.latency_batches),
        int(config.classifier_latency_repeats))
    return _finish(card, config)


def score_muddpythia(hf_dir: str, config, out_dir, log=print) -> dict:
    """The scorecard of a MUDDPythia HF directory: the audit (``config.audit``, whose data
    section names the local validation and test text and the window length) for variation
    and dependence, and :func:`muddpythia_execution_panel` on test windows."""
    from dynjax.audit import inputs

    audit = _audit(config.audit, out_dir, log, hf_dir, muddpythia_dir=hf_dir)
    target, cfg, tokenizer = inputs.load_muddpythia_target(hf_dir, config.audit.muddpythia.dtype)
    model, params = build(cfg), jax.device_put(target["params"])   # loaded as host arrays
    seq_len = audit["meta"]["windows"]["seq_len"]
    _, windows, _ = inputs.muddpythia_windows(config.audit.data, tokenizer, cfg.vocab_size,
                                              seq_len, 0, int(config.execution_windows))
    card = _card(hf_dir, "muddpythia/muddpythia", params)
    _, coeffs = jax.jit(model.apply)(params, jnp.asarray(windows))
    card["variation"] = variation(audit, coeffs, cfg, model.schema, "muddpythia")
    card["dependence"] = dependence(audit)
    log(f"{hf_dir}: timing against static mixing")
    card["execution"] = muddpythia_execution_panel(cfg, params, windows,
                                                   tuple(config.latency_batches),
                                                   int(config.latency_repeats))
    return _finish(card, config)


def render_markdown(cards: list) -> str:
    lines = ["# Execution scorecard", "",
             "| checkpoint | model | variation | functional dependence | execution |",
             "|---|---|---|---|---|"]
    for c in cards:
        v = c["verdicts"]
        lines.append(f"| {c['run']} | {c['model']} | {v['variation']} | {v['dependence']} | "
                     f"{v['execution']} |")
    lines += ["", "Thresholds (configs/scorecard.py): " + ", ".join(
        f"{k} = {val}" for k, val in cards[0]["thresholds"].items()), ""]
    for c in cards:
        ex = c["execution"]
        lines += [f"## {c['run']} ({c['model']}, {c['params']:,} parameters)", ""]
        if "dependence" in c:
            lines += ["| condition | ΔNLL (nats) | 95% CI |", "|---|---|---|"]
            for name, r in c["dependence"]["conditions"].items():
                lines.append(f"| {r.get('label', name)} | {r['estimate']:+.4f} | "
                             f"[{r['ci_low']:+.4f}, {r['ci_high']:+.4f}] |")
            ret = c["dependence"]["retention"]
            if ret:
                lines.append(f"\nStatic-profile retention of the gap to GlobalMean: "
                             f"{ret['estimate']:.1%} [{ret['ci_low']:.1%}, {ret['ci_high']:.1%}]")
            lines.append("")
        lines += _execution_lines(ex) + [""]
    return "\n".join(lines)


def _latency_lines(latency: dict, baseline: str) -> list:
    out = []
    for name, r in latency.items():
        item, digits = ("tokens", 2) if "tokens_per_s" in r else ("examples", 3)
        out.append(f"- {name}: {r['ratio']:.3f}x {baseline} ({r['seconds'] * 1e3:.{digits}f} ms, "
                   f"{r[item + '_per_s']:.0f} {item}/s)")
    return out


def _execution_lines(ex: dict) -> list:
    """The execution panel in words: what runs, FLOP ratios, then each latency ratio."""
    flops = (f"FLOPs compiled {ex['flops_ratio_compiled']:.3f}, analytic "
             f"{ex['flops_ratio_analytic']:.3f}")
    load = f"(load average {ex['load_average']} while timing)"
    kind = ex.get("kind", "blocks")
    if kind == "units":
        opened = ", ".join(f"{o:.1f} of {n}" for o, n in zip(ex["open_units_per_example"],
                                                              ex["units"]))
        lines = [f"Open units per example {opened} ({ex['executed_fraction']:.1%} of hidden "
                 f"units); RelMAC {ex['relmac']:.3f} (controllers included). The masked "
                 f"forward computes every unit and zeroes the closed ones; vs {ex['dense_twin']}:"
                 f" {flops} {load}", *_latency_lines(ex["latency"], "dense")]
        if "structured" in ex:
            st = ex["structured"]
            lines += ["", f"Structured path (only the open blocks, gathered): FLOPs compiled "
                      f"{st['flops_ratio_compiled']:.3f}, analytic {st['flops_ratio_analytic']:.3f}"
                      " of dense", *_latency_lines(st["latency"], "dense")]
        return lines
    if kind == "mixing":
        return [f"Every block runs for every token ({ex['n_layers']} of {ex['n_layers']}: no "
                f"skipping); vs {ex['dense_twin']}: {flops} {load}",
                *_latency_lines(ex["latency"], ex["baseline"])]
    return [f"Executed blocks per token {ex['executed_blocks_per_token']:.2f} of "
            f"{ex['n_layers']}; vs {ex['dense_twin']}: {flops}; KV-cache bytes "
            f"{ex['kv_cache_bytes_ratio']:.3f} {load}", *_latency_lines(ex["latency"], "dense")]


VARIANCE_ORDER = ("layer", "stream", "source", "expert", "unit", "example", "token", "residual")


def _variance_parts(var: dict) -> list:
    """Every share the audit's decomposition reports, structure first, then input, then the
    residual (``total_ss`` is a sum of squares, not a share)."""
    seen = {k for shares in var.values() for k in shares} - {"total_ss"}
    return [p for p in VARIANCE_ORDER if p in seen] + sorted(seen - set(VARIANCE_ORDER))


def plot(card: dict):
    """Three panels: variance shares, ΔNLL with CIs, execution ratios vs dense."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(13, 3.8))
    ax1, ax2, ax3 = fig.subplots(1, 3)
    var = (card.get("variation") or {}).get("variance", {})
    names = list(var)
    bottom = np.zeros(len(names))
    for part in _variance_parts(var):
        vals = np.array([var[n].get(part, 0.0) for n in names], float)
        ax1.bar(names, vals, bottom=bottom, label=part)
        bottom += vals
    ax1.set_title("variation: share of coefficient variance")
    ax1.set_ylim(0, 1)
    if names:
        ax1.legend(fontsize=7)
    rows = (card.get("dependence") or {}).get("conditions", {})
    labels = [r.get("label", k) for k, r in rows.items()]
    est = np.array([r["estimate"] for r in rows.values()], float)
    err = np.array([[r["estimate"] - r["ci_low"], r["ci_high"] - r["estimate"]]
                    for r in rows.values()], float).T.reshape(2, -1)
    ax2.barh(labels, est, xerr=err if len(est) else None, color="tab:red")
    ax2.set_xscale("symlog", linthresh=1e-3)
    ax2.set_title("functional dependence: ΔNLL (nats)")
    ex = card["execution"]
    bars = {("open\nunits" if ex.get("kind") == "units" else "executed\nblocks"):
            ex["executed_fraction"],
            "FLOPs\ncompiled": ex["flops_ratio_compiled"],
            "FLOPs\nanalytic": ex["flops_ratio_analytic"],
            **{k.replace("_b", "\nb"): r["ratio"] for k, r in ex["latency"].items()}}
    if "structured" in ex:
        bars.update({"structured\nFLOPs": ex["structured"]["flops_ratio_compiled"],
                     **{"structured\n" + k.replace("forward_", ""): r["ratio"]
                        for k, r in ex["structured"]["latency"].items()}})
    ax3.bar(list(bars), list(bars.values()), color="tab:green")
    ax3.axhline(1.0, color="k", lw=0.8)
    ax3.tick_params(axis="x", labelsize=6 if len(bars) > 6 else 8)
    ax3.set_title(f"execution: relative to\n{ex['dense_twin']}", fontsize=8)
    fig.suptitle(f"{card['run']} ({card['model']})", fontsize=10)
    fig.tight_layout()
    return fig


def write(cards: list, out_dir, command: str = "") -> None:
    """scorecard.json ({command, cards}), scorecard.md and one figure per checkpoint, each
    written atomically."""
    from pathlib import Path

    from dynjax.audit.report import _save_fig, to_jsonable
    from dynjax.jsonio import write_json_atomic, write_text_atomic
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    clean = to_jsonable(cards)
    write_json_atomic(out / "scorecard.json", {"command": command, "cards": clean})
    write_text_atomic(out / "scorecard.md", render_markdown(clean))
    for i, card in enumerate(clean):
        _save_fig(plot(card), out / f"scorecard_{i}.png")
