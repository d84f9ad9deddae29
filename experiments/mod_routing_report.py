"""Routing report of a trained MoD run: how well the causal decode rules match top-k.

    python experiments/mod_routing_report.py RUN_DIR [--windows 64] [--out FILE]

Precision, recall and F1 of the router and predictor rules against top-k membership on test
windows (base rate beside them), on the top-k forward and the causal forward. JSON out.
"""
from dynjax.runtime import setup  # noqa: E402  one runtime set-up for every program (dynjax/runtime.py)
setup(__name__)
import argparse
import json

from dynjax.data import text
from dynjax.measure import routing
from dynjax.runs import rundir
from dynjax.jsonio import portable_path, stamp, write_json_atomic


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--windows", type=int, default=64)
    ap.add_argument("--out")
    args = ap.parse_args()
    config, model, params = rundir.load_params(args.run_dir)
    if config.model.family != "mod":
        raise SystemExit(f"{args.run_dir} is a {config.model.family!r} run; this needs a MoD run")
    dc = config.data
    splits = text.load_splits(dc.source, dc.get("path"), dc.get("tfds_name"), dc.get("data_dir"))
    windows = text.eval_windows(splits["test"], dc.seq_len, args.windows)
    report = {**stamp(), "run": portable_path(args.run_dir), "windows": len(windows),
              **routing.routing_report(model, params, windows)}
    print(json.dumps(report, indent=1))
    if args.out:
        write_json_atomic(args.out, report)


if __name__ == "__main__":
    main()
