"""Sample text from a trained language-model run, through the KV-cache decoder.

The program is ``dynjax/programs/sample.py`` (its usage and flags: ``python sample.py --help``);
installed, the same program is the ``dynjax-sample`` command.
"""
from dynjax.runtime import setup  # the allocator setting, before JAX starts: dynjax/runtime.py
setup(__name__)
from dynjax.programs import sample  # noqa: E402

if __name__ == "__main__":
    sample.start("sample.py")
