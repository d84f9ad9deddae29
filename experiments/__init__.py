"""The studies: each module is a program (``python experiments/NAME.py ...`` or
``python -m experiments.NAME ...`` from the checkout's root) and importable, so its tests
import it; experiments/README.md lists them. Tools (set-up, tests, digests, GPU checks) are
in scripts/."""
