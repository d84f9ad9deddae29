"""The package's own metadata agrees with itself."""
import pathlib
import tomllib

import dynjax
from tests.conftest import ROOT


def test_version_is_the_projects():
    project = tomllib.loads(pathlib.Path(ROOT, "pyproject.toml").read_text())["project"]
    assert dynjax.__version__ == project["version"]


def test_licence_file_is_the_declared_licence():
    project = tomllib.loads(pathlib.Path(ROOT, "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    assert "Apache License" in pathlib.Path(ROOT, "LICENSE").read_text()[:200]
