"""dynjax: build, train and audit dynamic-computation models (see README.md)."""
__version__ = "0.1.0"   # kept equal to pyproject.toml's version (tests/integration/test_package.py)
