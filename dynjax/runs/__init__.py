"""Run directories as ``train.py`` writes them, read without training code:
:mod:`~dynjax.runs.rundir` (the format: config, steps, parameters alone) and
:mod:`~dynjax.runs.integrity` (per-array checksums). Below ``dynjax.train``, which writes
runs; the audit's checkpoint targets are :mod:`dynjax.audit.targets`."""
