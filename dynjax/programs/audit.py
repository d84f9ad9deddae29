"""Frozen-Controller Audit: does a trained dynamic model depend on its coefficients?

    dynjax-audit --config=dynjax:audit_tiny --out=DIR --checkpoints RUN_DIR [RUN_DIR ...]
    dynjax-audit --config=dynjax:audit_muddpythia --muddpythia=HF_DIR --out=DIR
    dynjax-audit --config=dynjax:audit_hf --hf=ORG/NAME --out=DIR   # an MoE's routers
    dynjax-audit --combine=AUDIT_DIR,AUDIT_DIR[,...] --out=DIR   # audits run apart, as one
    python audit.py --config=configs/audit_tiny.py ...   # the same program, from a checkout

Replays recorded coefficients (bitwise, or it stops), then each condition: ΔNLL with
checkpoint-level statistics in DIR. Depth: docs/audit.md#the-audit-program-dynjaxprogramsauditpy
"""
import sys

from absl import flags, logging
from ml_collections import config_flags

from dynjax import errors, programs

PROG = "audit.py"   # the name errors are reported under (start() sets it)
COMMAND, DEFAULT_CONFIG = "audit", "audit_tiny"
config_flags.DEFINE_config_file("config", None, "dynjax:NAME (from a checkout also "
                                "configs/NAME.py); default dynjax:audit_tiny",
                                lock_config=True)
flags.DEFINE_list("checkpoints", [], "run directories written by dynjax-train "
                  "(further run directories may follow as positional arguments)")
flags.DEFINE_string("muddpythia", None, "a local MUDDPythia HF directory to audit instead")
flags.DEFINE_string("hf", None, "a Hugging Face MoE checkpoint (mixtral, olmoe, qwen2_moe, "
                    "qwen3_moe) to audit instead, its routers: a directory, or ORG/NAME[@REV] "
                    "in the local Hugging Face cache")
flags.DEFINE_list("combine", [], "audit.py --out directories of the same config and windows "
                  "(one per seed, audited apart) to combine into one audit")
flags.DEFINE_string("out", None, "output directory: results.json, report.md, plots")
flags.mark_flag_as_required("out")

programs.define_distributed_flags(flags)


def check_inputs() -> None:
    """What fails only after the whole audit ran, checked before it starts: the output
    folder's writability and the window counts."""
    from dynjax.jsonio import check_writable

    F = flags.FLAGS
    check_writable(F.out, "--out")
    dc = F.config.data
    if not F.combine and (int(dc.eval_windows) < 2 or int(dc.calib_windows) < 1):
        raise errors.AuditError(f"data.eval_windows={dc.eval_windows} and data.calib_windows="
                                f"{dc.calib_windows}: the audit needs at least 2 evaluation "
                                "windows (cross-input reassignment) and 1 calibration window")


def audit_or_combine(run_dirs):
    from dynjax.audit import run

    F = flags.FLAGS
    check_inputs()
    if not F.combine:
        return run.audit_from_config(F.config, run_dirs, F.muddpythia, F.out, hf_dir=F.hf)
    if run_dirs or F.muddpythia or F.hf:
        raise errors.AuditError("--combine joins finished audits; drop --checkpoints / "
                                "--muddpythia / --hf (audit those apart first)")
    return run.combine_dirs(F.combine, F.out)


def main(argv):
    from dynjax.audit import run
    from dynjax.parallel import distributed

    logging.set_verbosity(logging.WARNING)  # orbax logs every restore at INFO
    # many hosts: --coordinator_address/--num_processes/--process_id or --distributed
    errors.run_program(PROG, lambda: distributed.initialize_from_flags(flags))
    run_dirs = list(flags.FLAGS.checkpoints) + list(argv[1:])
    results = errors.run_program(PROG, lambda: audit_or_combine(run_dirs))
    print(run.verdict_table(results))
    print(f"wrote {flags.FLAGS.out}/results.json, report.md and plots")


def start(prog: str = "audit.py"):
    """The program under the name it was started by (``audit.py``, ``dynjax-audit``)."""
    programs.start(sys.modules[__name__], prog)
