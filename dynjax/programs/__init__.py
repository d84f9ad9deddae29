"""The command-line programs (``dynjax.programs.console``: their console commands).

A program module defines its flags at import and imports JAX and its library only inside
``main``, so ``--help`` is answered (:func:`start`) before any of that loads. Programs and
messages speak the form the user started: ``dynjax-train --config=dynjax:tiny`` for a
console command (or the library used outside a checkout), ``python train.py
--config=configs/tiny.py`` from a checkout (:func:`command`).
"""
import sys
import textwrap

from dynjax import configs
from dynjax.configs import command, installed  # noqa: F401  (programs.command)

HELP = ("-h", "--help", "-help", "--helpshort", "-?")


def define_distributed_flags(flags) -> None:
    """The start-up flags every multi-host program (train, audit) takes
    (:mod:`dynjax.parallel.distributed` reads them)."""
    flags.DEFINE_string("coordinator_address", None, "HOST:PORT of process 0: run on many "
                        "processes (every process runs the same command)")
    flags.DEFINE_integer("num_processes", None, "number of processes (with --coordinator_address)")
    flags.DEFINE_integer("process_id", None, "this process's index, 0..num_processes-1")
    flags.DEFINE_bool("distributed", False, "call jax.distributed.initialize() without "
                      "arguments: Cloud TPU, SLURM, Open MPI, Kubernetes fill them in")


def help_text(program, prog: str) -> str:
    """The program's docstring and the flags its module defines (and the start-up flags),
    each with its help and default: what ``--help`` prints."""
    from absl import flags

    lines = [(program.__doc__ or "").strip(), "", "flags:"]
    for module in (program.__name__, __name__):
        for flag in sorted(flags.FLAGS.get_flags_for_module(module), key=lambda f: f.name):
            default = getattr(flag, "default_unparsed", flag.default)
            text = f"--{flag.name}: {flag.help}" + (
                f" (default: {default!r})" if default not in (None, "", []) else "")
            lines += textwrap.wrap(text, 96, initial_indent="  ", subsequent_indent="      ")
    if getattr(program, "DEFAULT_CONFIG", None):
        lines.append(f"  (without --config: {command(program.COMMAND, program.DEFAULT_CONFIG)})")
    lines += ["", f"{prog} --helpfull lists every flag (absl's and JAX's too)."]
    return "\n".join(lines)


def start(program, prog: str):
    """Run ``program`` (a program module: ``main``, ``PROG``, its docstring as --help) under
    the name it was started by (``train.py``, ``dynjax-train``): errors are reported under it.
    ``--help`` prints :func:`help_text` before JAX or the program's library is imported; a
    program with a ``DEFAULT_CONFIG`` gets it as ``--config`` when none is given; data the
    program reads and the data folder lacks is fetched on first use (dynjax.data.fetch)."""
    configs.STARTED_AS = program.PROG = prog
    args = sys.argv[1:]
    args = args[:args.index("--")] if "--" in args else args
    if any(a in HELP for a in args):
        print(help_text(program, prog))
        sys.exit(0)
    from absl import app

    from dynjax import errors
    from dynjax.data import fetch

    fetch.ON_DEMAND = True     # data a config needs and the data folder lacks: fetched now

    argv = configs.expand(prog, sys.argv)
    default = getattr(program, "DEFAULT_CONFIG", None)
    if default and not any(a == "--config" or a.startswith("--config=") for a in argv[1:]):
        argv.insert(1, "--config=" + configs.path(default))
    sys.modules["__main__"].__doc__ = program.__doc__   # what --helpfull prints
    app.run(program.main, argv=argv, flags_parser=errors.flags_parser(prog))
