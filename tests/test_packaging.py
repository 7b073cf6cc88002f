"""What ``pip install`` puts on a machine: one import name, ``bargein``, and its page."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {
    "app": "bargein.app",
    "client": "bargein.client",
    "engine": "bargein.engine",
    "session": "bargein.session",
    "protocol": "bargein.protocol",
    "static": "bargein.static",
    "voice": "bargein.voice",
}


def test_every_package_in_the_tree_is_listed() -> None:
    """A new sub-package that pyproject.toml forgets would be missing from a
    non-editable install while an editable one still finds it."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    in_tree = {"bargein"} | {
        ".".join([FOLDERS[folder], *init.parent.relative_to(ROOT / folder).parts])
        for folder in FOLDERS
        for init in (ROOT / folder).rglob("__init__.py")
    }
    assert set(setuptools["packages"]) == in_tree
    assert {k: v for k, v in setuptools["package-dir"].items() if k != "bargein"} == {
        v: k for k, v in FOLDERS.items()
    }


@pytest.mark.slow
def test_the_wheel_holds_only_bargein(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("bargein-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names} == {"bargein", wheel.name.split("-py")[0] + ".dist-info"}
    for must in (
        "bargein/__main__.py",
        "bargein/engine/engine.py",
        "bargein/session/streams/log/redis_streams.py",
        "bargein/app/openai/routes.py",
        "bargein/client/realtime_client.py",
        "bargein/static/index.html",
        "bargein/static/bargein.js",
    ):
        assert must in names
    entry_points = (
        zipfile.ZipFile(wheel)
        .read(next(n for n in names if n.endswith(".dist-info/entry_points.txt")))
        .decode()
    )
    assert "bargein = bargein.app.cli:main" in entry_points
