"""What this machine gives an image build without copying it into the image: its pip
configuration (to mount read-only) and its Debian mirror (for a debootstrap base).

Used by tools/image_check.py (docs/images.md): a build on a machine whose pip reaches the package
index only through its own configuration (a CA bundle, local wheel directories, file:// indexes)
gets that configuration as one file mounted at /etc/pip.conf and every local path it names
mounted under MOUNT_ROOT; mounts are never part of the image.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import urllib.parse
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

MOUNT_ROOT = "/run/pip-host"
# What pip needs to reach an index; the GPU build keeps only these (local wheel directories and
# extra indexes could hold CPU builds of torch, and the GPU stack must come from its one index).
NETWORK_KEYS = {"cert", "client-cert", "timeout", "default-timeout", "retries", "proxy", "trusted-host", "index-url"}


def parse_pip_config_list(text: str) -> Dict[str, str]:
    """``pip config list`` output -> the options ``pip install`` uses, by key.

    Lines are ``section.key='value'``; the ``:env:`` section (PIP_* variables) wins over
    ``install``, which wins over ``global``, as in pip. Other sections do not apply to install.
    """
    rank = {"global": 0, "install": 1, ":env:": 2}
    found: Dict[str, Tuple[int, str]] = {}
    for line in text.splitlines():
        m = re.match(r"^(:env:|[\w-]+)\.([\w-]+)=(.*)$", line.strip())
        if not m or m.group(1) not in rank:
            continue
        try:
            value = str(ast.literal_eval(m.group(3)))
        except (ValueError, SyntaxError):
            value = m.group(3)
        key, level = m.group(2), rank[m.group(1)]
        if key not in found or level >= found[key][0]:
            found[key] = (level, value)
    return {k: v for k, (_, v) in found.items()}


def host_pip_config() -> Dict[str, str]:
    """The effective pip options of this machine (empty when no pip is at hand to ask)."""
    for python in (sys.executable, shutil.which("python3") or ""):
        if not python:
            continue
        proc = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60)
        if proc.returncode == 0:
            return parse_pip_config_list(proc.stdout)
    return {}


def build_pip_config(options: Mapping[str, str], variant: str) -> Tuple[str, List[Tuple[str, str]]]:
    """(pip.conf text for the build, [(host path, path in the build)] to mount read-only).

    Local paths and file:// URLs are rewritten to their mount under MOUNT_ROOT (the whole tree of
    a ``.../simple`` index, whose pages link to ``../../files``); URLs stay as they are.
    """
    mounts: Dict[str, str] = {}

    def mount(path: str) -> str:
        real = os.path.realpath(path)
        if any(c in real for c in ":,"):
            raise ValueError(f"pip configuration path {real!r} holds ':' or ',', which --volume cannot mount")
        mounts[real] = MOUNT_ROOT + real
        return MOUNT_ROOT + real

    def rewrite(token: str) -> str:
        if token.startswith("file://"):
            path = urllib.parse.unquote(urllib.parse.urlparse(token).path)
            real = os.path.realpath(path)
            tree = os.path.dirname(real) if os.path.basename(real) == "simple" else real
            inside = mount(tree) + real[len(tree):]
            return "file://" + urllib.parse.quote(inside)
        if token.startswith("/") and os.path.exists(token):
            real = os.path.realpath(token)
            return mount(real)
        return token

    lines = ["[global]"]
    for key, value in sorted(options.items()):
        if variant == "gpu" and key not in NETWORK_KEYS:
            continue
        lines.append(f"{key} = {' '.join(rewrite(t) for t in value.split())}")
    # one mount per tree: drop paths inside another mounted directory
    keep = sorted(mounts)
    keep = [p for p in keep if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in keep)]
    return "\n".join(lines) + "\n", [(p, mounts[p]) for p in keep]


# ---- this machine's Debian mirror ----------------------------------------------------------


def debian_mirror(apt_dir: Path = Path("/etc/apt")) -> Optional[str]:
    """The first Debian archive URI of the apt sources (not a security archive); None if none."""
    files = [apt_dir / "sources.list"] + sorted((apt_dir / "sources.list.d").glob("*"))
    for path in files:
        if not path.is_file() or path.suffix not in ("", ".list", ".sources"):
            continue
        text = path.read_text(errors="replace")
        if path.suffix == ".sources":  # deb822 stanzas
            for stanza in re.split(r"\n\s*\n", text):
                fields = dict(re.findall(r"(?m)^([\w-]+):\s*(.*)$", stanza))
                if "deb" not in fields.get("Types", "").split() or fields.get("Enabled", "yes") == "no":
                    continue
                suites = fields.get("Suites", "").split()
                for uri in fields.get("URIs", "").split():
                    if not any(s.endswith("-security") for s in suites) and "security" not in uri:
                        return uri
        else:
            for line in text.splitlines():
                m = re.match(r"^\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", line)
                if m and not m.group(2).endswith("-security") and "security" not in m.group(1):
                    return m.group(1)
    return None
