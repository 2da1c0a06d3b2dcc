"""Documented commands cannot rot: README.md and docs/**/*.md are checked against the code.

What is checked:
- every ``slipstream-train`` / ``slipstream-data`` command in a fenced code block (and in the
  Makefile and the comments of conf/, the presets' own examples), including the
  ones run through ``torchrun ... -m slipstream_rec.train``, ``srun``, ``docker run`` or TorchX
  (``launch/components.py:train ... -- OVERRIDES``), parses with the command's own argument
  parser and composes its configuration in-process, as ``--cfg`` does (nothing is trained or
  converted). For ``slipstream-data`` the data config is composed and validated
  (``build_config`` + ``normalize_data_config``); the input files are not opened, since they are
  the user's (a ``--schema`` file is: the docs show it in a YAML block named by its first comment
  line, ``# clicks.yaml: ...``, which is written out first);
- every ``$ command`` followed by output lines is run in-process from an empty directory (with the
  process group replaced by a tripwire) and must print exactly the documented lines on stderr and
  exit 2;
- the configuration tables (README.md and docs/configuration.md) list every option of every
  group in conf/;
- the README's "Train on your own click log": its CSV sample is what the test's generator writes,
  and its three commands, run as shown in a fresh directory, take the file to a report.

Not checked: commands inside inline code in prose, other programs' arguments (``torchrun``,
``torchx``, ``docker``, ``launch/sweep.py``, ``benchmarks/*.py``, ``slipstream-report`` outside
the three-command flow), and shell variables (``$NODE0`` stays literal).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SEPARATORS = {";", "&", "&&", "|", "||", "(", ")"}
COMMAND_WORDS = re.compile(r"slipstream-(train|data)\b|-m slipstream_rec\.(train|data_cli)\b|components\.py:train")


@dataclass
class Block:
    file: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str

    def where(self, offset: int = 0) -> str:
        return f"{self.file.relative_to(ROOT)}:{self.line + 1 + offset}"


def code_blocks(path: Path) -> List[Block]:
    blocks, lines = [], path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^\s*```(\S*)\s*$", lines[i])
        if m:
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith("```"):
                j += 1
            blocks.append(Block(path, i + 1, m.group(1), "\n".join(lines[i + 1 : j])))
            i = j
        i += 1
    return blocks


ALL_BLOCKS = [b for p in DOCS for b in code_blocks(p)]


def _logical_lines(text: str) -> List[Tuple[int, str]]:
    """(offset of the first physical line, line with backslash continuations joined)."""
    out, buf, start = [], "", 0
    for k, raw in enumerate(text.splitlines()):
        if not buf:
            start = k
        if raw.rstrip().endswith("\\"):
            buf += raw.rstrip()[:-1] + " "
            continue
        out.append((start, buf + raw))
        buf = ""
    if buf:
        out.append((start, buf))
    return out


def _segments(line: str) -> List[List[str]]:
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    lex.commenters = "#"
    segs: List[List[str]] = [[]]
    for tok in lex:
        if tok in SEPARATORS:
            segs.append([])
        else:
            segs[-1].extend(_brace_range(tok))
    return [s for s in segs if s]


def _brace_range(token: str) -> List[str]:
    """bash's ``day_{0..22}.gz`` expansion (the only brace form the docs use)."""
    m = re.search(r"\{(\d+)\.\.(\d+)\}", token)
    if not m:
        return [token]
    return [token[: m.start()] + str(i) + token[m.end() :] for i in range(int(m.group(1)), int(m.group(2)) + 1)]


@dataclass
class Command:
    where: str
    program: str  # "train" or "data"
    argv: List[str]

    def __str__(self) -> str:
        return f"{self.where}: {self.program} {' '.join(self.argv)}"


def _command_in(tokens: List[str]) -> Optional[Tuple[str, List[str]]]:
    for i, tok in enumerate(tokens):
        name = tok.rsplit("/", 1)[-1]
        if name == "slipstream-train":
            return "train", tokens[i + 1 :]
        if name == "slipstream-data":
            return "data", tokens[i + 1 :]
        if tok == "-m" and i + 1 < len(tokens) and tokens[i + 1] in ("slipstream_rec.train", "slipstream_rec.data_cli"):
            return ("train" if tokens[i + 1] == "slipstream_rec.train" else "data"), tokens[i + 2 :]
        if tok.endswith("launch/components.py:train"):
            rest = tokens[i + 1 :]
            return "train", rest[rest.index("--") + 1 :] if "--" in rest else []
    return None


def documented_commands() -> List[Command]:
    out = []
    for b in ALL_BLOCKS:
        if b.lang not in ("", "bash", "sh", "shell", "console"):
            continue
        if any(line.startswith("$ ") for line in b.text.splitlines()):
            continue  # `$ command` lines with their output: examples (checked below)
        for offset, line in _logical_lines(b.text):
            if not line.strip():
                continue
            try:
                segments = _segments(line)
            except ValueError:  # not shell (a layout listing, prose in a text block)
                assert not COMMAND_WORDS.search(line), f"{b.where(offset)}: cannot parse {line!r}"
                continue
            for seg in segments:
                found = _command_in(seg)
                if found:
                    out.append(Command(b.where(offset), *found))
    return out


def documented_examples() -> List[Tuple[str, str, List[str], List[str]]]:
    """(where, program, argv, expected output lines) of each ``$ command`` with its output."""
    out = []
    for b in ALL_BLOCKS:
        lines = b.text.splitlines()
        for k, line in enumerate(lines):
            if not line.startswith("$ "):
                continue
            expected = []
            for follow in lines[k + 1 :]:
                if follow.startswith("$ "):
                    break
                expected.append(follow)
            found = _command_in(shlex.split(line[2:]))
            assert found, f"{b.where(k)}: an example that is not a slipstream command: {line}"
            out.append((b.where(k), found[0], found[1], expected))
    return out


def commented_commands() -> List[Command]:
    """The commands in the Makefile (its comments and recipes, ``$(VAR)`` as its default) and in the
    comments of conf/**/*.yaml (the presets' own examples): a comment line that starts with a
    command, or a command in backticks (one with a ``<placeholder>`` is left out)."""
    out = []
    files = [ROOT / "Makefile", *sorted((ROOT / "conf").glob("*/*.yaml")), ROOT / "conf" / "config.yaml"]
    for path in files:
        for k, raw in enumerate(path.read_text().splitlines()):
            where = f"{path.relative_to(ROOT)}:{k + 1}"
            text = raw.strip()
            candidates = []
            if text.startswith("#"):
                comment = text.lstrip("#").strip()
                candidates += re.findall(r"`([^`]+)`", comment)
                if COMMAND_WORDS.match(comment):
                    candidates.append(comment)
            elif path.name == "Makefile" and raw.startswith("\t"):  # $(VAR): its ?= default
                defaults = dict(re.findall(r"^(\w+)\s*\?=\s*(\S+)", path.read_text(), flags=re.M))
                candidates.append(re.sub(r"\$\((\w+)\)", lambda m: defaults.get(m.group(1), ""), text))
            for line in candidates:
                if "<" in line or not COMMAND_WORDS.search(line):
                    continue
                for seg in _segments(line):
                    found = _command_in(seg)
                    if found:
                        out.append(Command(where, *found))
    return out


COMMANDS = documented_commands()
EXAMPLES = documented_examples()
COMMENTED = commented_commands()


def write_named_yaml_blocks(directory: Path) -> None:
    """YAML blocks whose first line is ``# NAME.yaml...`` are files the commands use."""
    for b in ALL_BLOCKS:
        m = re.match(r"#\s*([\w.-]+\.ya?ml)\b", b.text)
        if b.lang in ("yaml", "yml") and m:
            (directory / m.group(1)).write_text(b.text + "\n")


def test_the_docs_hold_commands_to_check():
    # A parser that silently found nothing would pass everything below.
    files = {c.where.split(":")[0] for c in COMMANDS}
    assert len(COMMANDS) >= 30 and {"README.md", "docs/datasets.md", "docs/cluster.md"} <= files, files
    assert {c.program for c in COMMANDS} == {"train", "data"}
    assert len(EXAMPLES) >= 5


def test_the_makefile_and_the_presets_hold_commands_to_check():
    files = {c.where.split(":")[0] for c in COMMENTED}
    assert {"Makefile", "conf/data/criteo_kaggle.yaml", "conf/slipstream/random.yaml"} <= files, files


def test_options_named_in_the_makefile_and_conf_comments_exist():
    """``data=synthetic`` in a comment names an option that exists (a renamed preset would
    otherwise leave its comments pointing at nothing)."""
    from slipstream_rec.config import group_options

    groups = sorted(p.name for p in (ROOT / "conf").iterdir() if p.is_dir())
    for path in [ROOT / "Makefile", *sorted((ROOT / "conf").glob("**/*.yaml"))]:
        for k, line in enumerate(path.read_text().splitlines()):
            comment = line.split("#", 1)[1] if "#" in line else ""
            for group, option in re.findall(rf"\b({'|'.join(groups)})=(\w+)", comment):
                assert option in group_options(group), f"{path.relative_to(ROOT)}:{k + 1}: {group}={option} is no option"


@pytest.mark.parametrize("cmd", COMMANDS + COMMENTED, ids=str)
def test_documented_command_composes(cmd: Command, tmp_path, monkeypatch):
    from slipstream_rec import train
    from slipstream_rec.config import load_config

    monkeypatch.chdir(tmp_path)
    write_named_yaml_blocks(tmp_path)
    if cmd.program == "train":
        args = train.parse_args(cmd.argv)
        if args.self_check:
            return  # checks the installed stack: nothing to compose
        assert args.cfg in (None, "job", "all"), cmd
        load_config(args.overrides)
    else:
        from slipstream_rec.data_cli import build_config, parse_args
        from slipstream_rec.data.datasets import normalize_data_config

        normalize_data_config(build_config(parse_args(cmd.argv)))


@pytest.mark.parametrize("where, program, argv, expected", EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_documented_error_is_printed_exactly(where, program, argv, expected, tmp_path, monkeypatch, capsys):
    import slipstream_rec.distributed as distributed
    from slipstream_rec import train
    from slipstream_rec import data_cli

    def tripwire(*args, **kwargs):
        raise AssertionError(f"{where}: the documented failure got as far as starting a process group")

    monkeypatch.setattr(distributed, "init_distributed", tripwire)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    rc = (train.main if program == "train" else data_cli.main)(list(argv))
    assert rc == 2, where
    assert capsys.readouterr().err.strip().splitlines() == expected, where


def _table_rows(path: Path, first_header: str) -> dict:
    """{group: row text} of the markdown table whose first header cell is ``first_header``."""
    rows, inside = {}, False
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_header:
            inside = True
            continue
        if inside and not line.startswith("|"):
            inside = False
        if inside and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = line
    return rows


@pytest.mark.parametrize("doc", ["README.md", "docs/configuration.md"])
def test_configuration_table_lists_every_option(doc):
    from slipstream_rec.config import group_options

    rows = _table_rows(ROOT / doc, "group")
    groups = sorted(p.name for p in (ROOT / "conf").iterdir() if p.is_dir())
    assert sorted(rows) == groups, (doc, sorted(rows))
    for group in groups:
        missing = [o for o in group_options(group) if f"`{o}`" not in rows[group]]
        assert not missing, f"{doc}: the {group} row lacks {missing}"


def _readme_section(title: str) -> List[Block]:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    first = text[:start].count("\n") + 1
    last = text[: end if end >= 0 else len(text)].count("\n") + 1
    return [b for b in ALL_BLOCKS if b.file.name == "README.md" and first <= b.line <= last]


def test_readme_three_commands_take_a_csv_to_a_report(tmp_path):
    from tests.data._clicks import make_clicks, write_csv

    blocks = _readme_section("Train on your own click log")
    schema = next(b for b in blocks if b.lang == "yaml")
    sample = next(b for b in blocks if b.lang == "")
    commands = [line for _, line in _logical_lines(next(b for b in blocks if b.lang == "bash").text) if line.strip()]
    assert len(commands) == 3, commands
    write_named_yaml_blocks(tmp_path)
    assert (tmp_path / re.match(r"#\s*(\S+\.yaml)", schema.text).group(1)).is_file()
    csv = write_csv(tmp_path / "clicks.csv", make_clicks(6000, seed=0))
    # The sample shown is the head of the file the commands run on here.
    assert csv.read_text().splitlines()[: len(sample.text.splitlines())] == sample.text.splitlines()
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", OMP_NUM_THREADS="1")
    env.pop("HYDRA_FULL_ERROR", None)
    printed = []
    for line in commands:
        r = subprocess.run(shlex.split(line), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"{line}\nstdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}"
        printed += [l.removeprefix("train with: ") for l in r.stdout.splitlines() if l.startswith("train with: ")]
    # the README's train command is the one slipstream-data printed, with the run directory added
    assert printed and f"{printed[0]} trainer.run_dir=runs/clicks" == commands[1], (printed, commands[1])
    summaries = list(tmp_path.glob("runs/*/summary.json"))
    assert len(summaries) == 1
    summary = json.loads(summaries[0].read_text())
    # the run trained on the converted file: the schema's time split of its 6000 rows, in full
    # batches (the loader drops an epoch's partial last one); the report shows the run's test AUC
    from slipstream_rec.data.meta import load_meta

    meta = load_meta(tmp_path / "data" / "clicks")
    assert meta.rows == {"train": 5400, "val": 300, "test": 300}
    batch = 256  # the README's command: 5400 rows give 21 full batches of it
    assert summary["batch_size_per_rank"] == batch
    assert summary["steps"] == summary["epochs"] * (meta.rows["train"] // batch) == 21
    assert summary["samples_seen"] == summary["samples_trained"] == summary["steps"] * batch
    reports = list(tmp_path.glob("reports/*/report.html"))
    assert len(reports) == 1 and format(summary["test_auc"], ".4f") in reports[0].read_text()


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_to_existing_files_and_headings(doc):
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        assert dest.exists(), f"{doc.relative_to(ROOT)}: link to {target}: no such file"
        if anchor and dest.suffix == ".md":
            headings = [_slug(h) for h in re.findall(r"^#+ (.+)$", dest.read_text(), flags=re.M)]
            assert anchor in headings, f"{doc.relative_to(ROOT)}: link to {target}: no such heading"


# -- the docs cite only the repository, and agree with --help (issue 32) -------------------------


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_cite_only_files_in_the_repository(doc):
    """A relative path in a link or in inline code resolves inside the checkout (a reader of
    the repository has nothing else)."""
    text = doc.read_text()
    # inline code: a relative path naming a file (`../shared/notes/x.md`), not prose about
    # relative links (`../../files` in docs/images.md)
    cited = re.findall(r"\]\(([^)\s#]+)", text) + re.findall(r"`((?:\.\./)+[^`\s]+\.[a-z]+)`", text)
    for target in cited:
        if re.match(r"[a-z]+://", target):
            continue
        # relative to the document (a link) or to the checkout's root (a path in prose)
        inside = [d for d in ((doc.parent / target).resolve(), (ROOT / target).resolve()) if d.is_relative_to(ROOT)]
        assert any(d.exists() for d in inside), f"{doc.relative_to(ROOT)}: cites {target}, not a file of the repository"


def _train_help(capsys) -> str:
    from slipstream_rec import train

    with pytest.raises(SystemExit):
        train.main(["--help"])
    return capsys.readouterr().out


def _help_defaults(help_text: str) -> dict:
    listed = help_text.split("config groups", 1)[1].splitlines()[1:]
    defaults, group = {}, None
    for line in listed:
        if line.startswith("    ") and line.strip().startswith("*"):
            defaults[group] = line.split()[0].lstrip("*")
        elif line.startswith("  ") and line.strip().endswith(":"):
            group = line.strip().rstrip(":")
    return defaults


def test_configuration_tables_mark_the_defaults_help_marks(capsys):
    """README's table lists the default first, configuration.md's says "(default"; both are the
    option `--help` marks with *."""
    defaults = _help_defaults(_train_help(capsys))
    assert set(defaults) >= {"model", "data", "slipstream"}, defaults
    readme = _table_rows(ROOT / "README.md", "group")
    conf = _table_rows(ROOT / "docs/configuration.md", "group")
    for group, option in defaults.items():
        first = re.findall(r"`([^`]+)`", readme[group].split("|")[2])[0]
        assert first == option, f"README.md lists {first} first for {group}; --help's default is {option}"
        only = len(re.findall(r"`[^`]+`", conf[group].split("|")[2])) == 1
        assert only or f"`{option}` (default" in conf[group], f"docs/configuration.md: {group}'s default is not {option}"


def test_help_describes_what_the_default_does(capsys):
    """--help's description names the default Slipstream preset and does not call it skipping
    when it drops nothing (the README: Slipstream as `serve`)."""
    from slipstream_rec.config import default_options, load_config

    text = _train_help(capsys)
    description = " ".join(text.split("\n\n", 2)[1].split())
    default = default_options()["slipstream"]
    assert f"slipstream={default}" in description, description
    job = load_config([])
    if not job.slipstream.skips:
        assert "nothing skipped" in description and "stale-embedding skipping" not in description
    assert f"Slipstream (`{default}`)" in (ROOT / "README.md").read_text()


def test_every_help_flag_and_exit_code_is_documented(capsys):
    text = _train_help(capsys)
    docs = "\n".join(p.read_text() for p in DOCS)
    for flag in sorted(set(re.findall(r"(--[a-z][a-z-]+)", text)) - {"--help", "--standalone"}):
        assert f"slipstream-train {flag}" in docs or f"`{flag}" in docs, f"{flag} is in --help, not in the docs"
    codes = (ROOT / "docs/configuration.md").read_text().split("Exit codes:", 1)[1].split("\n\n", 1)[0]
    for code in re.findall(r"exit code (\d+)", text):
        assert f" {code} " in codes, f"--help names exit code {code}; docs/configuration.md's list does not"
