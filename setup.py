"""Build hook only: everything else is in pyproject.toml.

A built (non-editable) wheel carries ``slipstream_rec/_stack_pins.json``, a copy of pyproject's
``[tool.slipstream_rec.stack]`` tables made at build time, so that ``slipstream-train
--self-check`` can compare the installed torch / fbgemm / torchrec with the pins even where the
repository (and its pyproject.toml) is absent, e.g. in the Docker images. pyproject.toml stays the
only place the pins are written by hand; an editable install reads it directly.
"""

import json
import tomllib
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PINS_FILE = "_stack_pins.json"


class BuildPyWithStackPins(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # editable: self_check reads the repository's pyproject.toml
        pyproject = tomllib.loads(Path(__file__).with_name("pyproject.toml").read_text())
        payload = {
            "source": f"pyproject.toml of {pyproject['project']['name']} {pyproject['project']['version']} (embedded at build time)",
            "stack": pyproject["tool"]["slipstream_rec"]["stack"],
        }
        target = Path(self.build_lib) / "slipstream_rec" / PINS_FILE
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")

    def get_outputs(self, include_bytecode: bool = True):  # type: ignore[override]
        outputs = list(super().get_outputs(include_bytecode))
        if not getattr(self, "editable_mode", False):
            outputs.append(str(Path(self.build_lib) / "slipstream_rec" / PINS_FILE))
        return outputs


setup(cmdclass={"build_py": BuildPyWithStackPins})
