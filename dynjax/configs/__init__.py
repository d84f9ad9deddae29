"""The configs, one file per experiment (``get_config(arg)``).

From a checkout they are ``--config=configs/NAME.py[:ARG]`` (``configs/`` at the root is a
link to this folder, so ``from configs import tiny`` works there too); anywhere, and after
``pip install``, they are ``--config=dynjax:NAME[:ARG]``, which every program expands to
this folder's file.
"""
import pathlib

DIR = pathlib.Path(__file__).resolve().parent
PREFIX = "dynjax:"


STARTED_AS = None   # the name the running program was started under (programs.start sets it)


def installed() -> bool:
    """Whether to speak the installed form: a console command runs, or no checkout holds
    the package (a checkout's own ``python train.py`` speaks the checkout form)."""
    if STARTED_AS is not None:
        return STARTED_AS.startswith("dynjax-")
    return not in_checkout()


def command(program: str, config: str | None = None) -> str:
    """How to start ``program`` (``train``, ``audit``...) with ``config`` (``NAME[:ARG]``)
    in the form the user is in: ``dynjax-train --config=dynjax:tiny:feature_gate`` or
    ``python train.py --config=configs/tiny.py:feature_gate``."""
    if installed():
        return f"dynjax-{program}" + (f" --config=dynjax:{config}" if config else "")
    name, sep, arg = (config or "").partition(":")
    return f"python {program}.py" + (f" --config=configs/{name}.py{sep}{arg}" if config else "")


def names() -> list[str]:
    """The configs (files with a ``get_config``; ``common``, ``mlp_common`` are helpers)."""
    return sorted(p.stem for p in DIR.glob("*.py")
                  if not p.stem.startswith("_") and "\ndef get_config(" in p.read_text())


def in_checkout() -> bool:
    """Whether this package is a checkout's (its pyproject.toml beside it), not installed."""
    return (DIR.parents[1] / "pyproject.toml").is_file()


def path(name: str) -> str:
    """The file of config ``name`` (``tiny``, ``audit_tiny``, ...)."""
    return str(DIR / f"{name}.py")


def expand(prog: str, argv: list[str]) -> list[str]:
    """``argv`` with ``--config=dynjax:NAME[:ARG]`` (or ``--config dynjax:NAME[:ARG]``) made
    ``--config=DIR/NAME.py[:ARG]``; an unknown NAME is one line and exit status 2."""
    out = list(argv)
    for i, arg in enumerate(out):
        value = arg[len("--config="):] if arg.startswith("--config=") else \
            out[i + 1] if arg == "--config" and i + 1 < len(out) else None
        if value is not None and value.startswith("configs/") and \
                not pathlib.Path(value.partition(":")[0]).exists():
            _checkout_path(prog, value)
        if value is None or not value.startswith(PREFIX):
            continue
        name, sep, rest = value[len(PREFIX):].partition(":")
        if name not in names():
            from dynjax.errors import exit_with_error
            exit_with_error(prog, f"bad command line: --config={value}: no config {name!r} in "
                            f"dynjax; choose one of {', '.join(names())}")
        value = path(name) + sep + rest
        if arg == "--config":
            out[i + 1] = value
        else:
            out[i] = "--config=" + value
    return out


def _checkout_path(prog: str, value: str) -> None:
    """``--config=configs/NAME.py`` where there is no checkout: one line naming the
    installed form of the same config."""
    from dynjax.errors import exit_with_error

    file, sep, arg = value.partition(":")
    name = pathlib.Path(file).stem
    known = f"the installed form is --config={PREFIX}{name}{sep}{arg}" if name in names() \
        else f"the installed configs are {PREFIX}NAME, NAME one of {', '.join(names())}"
    exit_with_error(prog, f"bad command line: --config={value}: no such file here "
                    f"(configs/ is a checkout's folder); {known}")
