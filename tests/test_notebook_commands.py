"""Every command line the notebooks, README.md and docs/*.md show uses only flags that its
command defines.

Command lines are ``python launch/X.py ...`` and installed ``docnmt-X ...`` (the commands of
pyproject.toml's ``[project.scripts]``), taken from the notebooks' code cells (string literals,
with ``{NAME}`` filled from the notebook's own string assignments) and markdown cells (code
spans and fenced blocks), and from the fenced shell blocks of README.md and docs/*.md. The
flags are read from the real commands in one subprocess: absl commands' ``FLAGS`` (plus
absl's and libraries' own, ``--noX`` for booleans), argparse commands' parsers (per
subcommand). ``--config.X`` keys are config keys (``train.py --helpfull`` lists them), not
checked here.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from functools import cache

import pytest
import tomllib
from conftest import ROOT

DOCUMENTS = ["README.md", *sorted(f"docs/{n}" for n in os.listdir(os.path.join(ROOT, "docs")))]
DOCUMENTS = [d for d in DOCUMENTS if d.endswith(".md")]
NOTEBOOKS = sorted(f"notebooks/{n}" for n in os.listdir(os.path.join(ROOT, "notebooks")))
NOTEBOOKS = [n for n in NOTEBOOKS if n.endswith(".ipynb")]
#: Installed command -> its module under docnmt_jax/commands, when pyproject.toml lacks it.
INSTALLED = {
    "docnmt-prepare": "prepare_data",
    "docnmt-train": "train",
    "docnmt-translate": "translate",
    "docnmt-evaluate": "evaluate",
    "docnmt-analyze": "analyze",
    "docnmt-serve": "serve",
    "docnmt-export": "export",
}
FENCE = re.compile(r"^```([\w-]*)\s*$")
SHELL_FENCES = {"", "bash", "sh", "shell", "console", "zsh"}

# In a subprocess (absl commands define flags into one global registry, some with the same
# names): each command module's flags, then its absl flags removed for the next one.
FLAG_READER = r"""
import argparse, importlib, json, sys
from absl import flags

FLAGS = flags.FLAGS


class Parsed(Exception):
    pass


def capture(self, *args, **kwargs):
    raise Parsed(self)


argparse.ArgumentParser.parse_args = capture
argparse.ArgumentParser.parse_known_args = capture


def options(parser):
    names, subcommands = set(), {}
    for action in parser._actions:
        names.update(s.lstrip("-") for s in action.option_strings if s.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for sub, subparser in action.choices.items():
                subcommands[sub] = options(subparser)["flags"]
    return {"flags": sorted(names), "subcommands": subcommands}


out = {}
for name in sys.argv[1:]:
    module_name = "docnmt_jax.commands." + name
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name != module_name:
            raise
        out[name] = None
        continue
    own = list(FLAGS.flags_by_module_dict().get(module_name, []))
    if own:
        names = {f.name for f in own} | {"no" + f.name for f in own if f.boolean}
        out[name] = {"kind": "absl", "flags": sorted(names), "subcommands": {}}
        for f in own:  # a helper module's flags stay: valid for every absl command below
            delattr(FLAGS, f.name)
        continue
    try:
        module.main(["--help"])
    except Parsed as parsed:
        out[name] = {"kind": "argparse", **options(parsed.args[0])}
remaining = FLAGS._flags().values()
absl = {f.name for f in remaining} | {"no" + f.name for f in remaining if f.boolean}
absl |= {"help", "helpfull"}
print(json.dumps({"commands": out, "absl": sorted(absl)}))
"""


def installed_commands() -> dict[str, str]:
    """``docnmt-X`` -> module name: pyproject.toml's scripts, else :data:`INSTALLED`."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f).get("project", {}).get("scripts", {})
    found = {
        cmd: target.split(":")[0].rsplit(".", 1)[-1]
        for cmd, target in scripts.items()
        if target.startswith("docnmt_jax.commands.")
    }
    return {**INSTALLED, **found}


@cache
def command_pattern() -> re.Pattern:
    """``launch/X.py`` (group 1: X) or an installed command's name (group 2)."""
    names = "|".join(re.escape(n) for n in sorted(installed_commands(), key=len, reverse=True))
    return re.compile(rf"(?:\blaunch/(\w+)\.py|(?<![\w/.-])({names}))\b")


@cache
def command_flags() -> dict:
    """The flags of every command module (None: no such module yet) and absl's own flags."""
    modules = sorted(
        {n[:-3] for n in os.listdir(os.path.join(ROOT, "launch")) if n.endswith(".py")}
        | set(installed_commands().values())
    )
    proc = subprocess.run(
        [sys.executable, "-c", FLAG_READER, *modules],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------
# Extracting command lines.


def _shell_lines(block: str) -> list[str]:
    """The lines of a shell block, ``\\``-continued lines joined."""
    return block.replace("\\\n", " ").splitlines()


def _fenced_blocks(markdown: str, shell_only: bool) -> list[str]:
    blocks, current, inside = [], [], None
    for line in markdown.splitlines():
        fence = FENCE.match(line.strip())
        if fence and inside is None:
            inside, current = fence.group(1), []
        elif line.strip() == "```" and inside is not None:
            if not shell_only or inside in SHELL_FENCES:
                blocks.append("\n".join(current))
            inside = None
        elif inside is not None:
            current.append(line)
    return blocks


def _markdown_texts(markdown: str, shell_only: bool) -> list[str]:
    """Shell lines of the fenced blocks; with ``shell_only`` False also inline code spans."""
    texts = [ln for block in _fenced_blocks(markdown, shell_only) for ln in _shell_lines(block)]
    if not shell_only:
        outside = re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)
        texts += re.findall(r"`([^`\n]+)`", outside)
    return texts


def _texts(tree: ast.AST) -> list[str]:
    """The string literals under ``tree`` (an f-string whole, ``{NAME}`` for its names)."""
    inner = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    texts = []
    for node in ast.walk(tree):
        if id(node) in inner:
            continue
        if isinstance(node, ast.JoinedStr) or (
            isinstance(node, ast.Constant) and isinstance(node.value, str)
        ):
            texts.append(_template(node))
    return texts


def _string_values(tree: ast.AST) -> dict[str, str]:
    """``NAME = <strings>`` assignments of a notebook: every string of the value, joined (the
    alternatives of ``A if QUICK else B`` too)."""
    values: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            if isinstance(node.targets[0], ast.Name):
                values[node.targets[0].id] = " ".join(_texts(node.value))
    return values


def _template(node: ast.AST) -> str:
    """A string literal's text, ``{NAME}`` where an f-string formats a name."""
    if isinstance(node, ast.Constant):
        return node.value
    parts = []
    for value in node.values:
        if isinstance(value, ast.Constant):
            parts.append(str(value.value))
        else:
            expr = value.value
            parts.append("{%s}" % (expr.id if isinstance(expr, ast.Name) else "?"))
    return "".join(parts)


def _code_texts(sources: list[str]) -> list[str]:
    """The string literals of a notebook's code cells, ``{NAME}`` filled from its assignments,
    and its ``!``/``%`` shell lines."""
    trees, shell = [], []
    for source in sources:
        lines = source.splitlines()
        for i, line in enumerate(lines):
            if line.lstrip().startswith(("%", "!")):
                shell.append(line.lstrip()[1:])
                lines[i] = line[: len(line) - len(line.lstrip())] + "pass"
        trees.append(ast.parse("\n".join(lines)))
    values: dict[str, str] = {}
    for tree in trees:
        values.update(_string_values(tree))
    texts = [text for tree in trees for text in _texts(tree) if command_pattern().search(text)]
    return [re.sub(r"\{(\w+)\}", lambda m: values.get(m[1], "X"), t) for t in texts] + shell


def command_lines() -> list[tuple[str, str]]:
    """``(where, command line)`` of every command shown, from its name to its end."""
    found: list[tuple[str, str]] = []
    for name in NOTEBOOKS:
        with open(os.path.join(ROOT, name), encoding="utf-8") as f:
            cells = json.load(f)["cells"]
        code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
        texts = _code_texts(code)
        for cell in cells:
            if cell["cell_type"] == "markdown":
                texts += _markdown_texts("".join(cell["source"]), shell_only=False)
        found += [(name, text) for text in texts]
    for name in DOCUMENTS:
        with open(os.path.join(ROOT, name), encoding="utf-8") as f:
            found += [(name, text) for text in _markdown_texts(f.read(), shell_only=True)]
    commands = []
    for where, text in found:
        starts = [m.start() for m in command_pattern().finditer(text)]
        for start, end in zip(starts, [*starts[1:], len(text)], strict=False):
            commands.append((where, _cut(text[start:end])))
    return commands


def _cut(command: str) -> str:
    """``command`` up to a shell separator or comment outside ``[...]`` alternatives."""
    depth = 0
    for i, char in enumerate(command):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth <= 0 and (char in ";|#" or command.startswith("&&", i)):
            return command[:i]
    return command


# ---------------------------------------------------------------------------------------------
# The checks.


def parse_command(command: str) -> tuple[str, str | None, list[str]]:
    """``(module, subcommand or None, flag names)`` of one command line."""
    match = command_pattern().search(command)
    assert match, command
    module = match[1] or installed_commands().get(match[2], match[2])
    words = command[match.end() :].split()
    sub = words[0] if words and re.fullmatch(r"[a-z][\w-]*", words[0]) else None
    flags = []
    for word in words:
        word = word.strip("[]()'\",")
        if word.startswith("--") and len(word) > 2:
            flags.append(word[2:].split("=")[0].strip("[]"))
    return module, sub, flags


def unknown_flags(command: str, known: dict) -> list[str]:
    module, sub, flags = parse_command(command)
    spec = known["commands"][module]
    valid = set(spec["flags"]) | {"help"}
    if spec["kind"] == "absl":
        valid |= set(known["absl"])
    elif sub is not None and spec["subcommands"]:
        assert sub in spec["subcommands"], f"{module}: no subcommand {sub!r}"
        valid |= set(spec["subcommands"][sub])
    return [f for f in flags if f not in valid and not f.startswith("config.")]


def test_command_lines_are_found():
    commands = command_lines()
    where = {w for w, _ in commands}
    assert "notebooks/quickstart.ipynb" in where and "README.md" in where
    parsed = [parse_command(c) for _, c in commands]
    # the quick start's commands, with the flags of the notebook's string variables filled in
    assert ("prepare_data", None, ["corpus", "out"]) in [(m, s, f[:2]) for m, s, f in parsed]
    assert any(m == "prepare_data" and "synthetic_train_documents" in f for m, _, f in parsed)
    assert any(m == "evaluate" and "ref" in f for m, _, f in parsed)


def test_parse_command_reads_flags_and_subcommands():
    assert parse_command("python launch/analyze.py attention --workdir R --doc=D [--quiet]") == (
        "analyze",
        "attention",
        ["workdir", "doc", "quiet"],
    )
    module, sub, flags = parse_command("docnmt-prepare --corpus bible --out data/bible")
    assert (module, sub, flags) == (installed_commands()["docnmt-prepare"], None, ["corpus", "out"])
    line = "launch/x.py --a 1 [--b | --c] | tee log # note"
    assert _cut(line) == "launch/x.py --a 1 [--b | --c] "


def _shown_modules() -> list[str]:
    return sorted({parse_command(c)[0] for _, c in command_lines()})


@pytest.mark.parametrize("module", _shown_modules())
def test_every_shown_flag_is_defined(module):
    known = command_flags()
    assert known["commands"].get(module) is not None, (
        f"the docs show commands of docnmt_jax.commands.{module}, which does not exist"
    )
    unknown = [
        f"{where}: --{flag} in `{command.strip()}`"
        for where, command in command_lines()
        if parse_command(command)[0] == module
        for flag in unknown_flags(command, known)
    ]
    assert not unknown, "flags the command does not define:\n" + "\n".join(unknown)


def test_the_checker_catches_an_unknown_flag():
    """The known answer: the notebook's old mistake, ``evaluate.py --input``."""
    known = command_flags()
    assert known["commands"]["evaluate"]["kind"] == "absl"
    assert unknown_flags("launch/evaluate.py --workdir RUN --input TEST.tsv", known) == ["input"]
    assert unknown_flags("launch/evaluate.py --workdir RUN --ref TEST.tsv --nojson", known) == []
    assert unknown_flags("launch/analyze.py attention --workdir R --sizes 1", known) == ["sizes"]
    assert unknown_flags("launch/analyze.py context-curve --workdir R --sizes 1", known) == []
