"""The command lines' error boundary: a user's mistake prints one line
``PROG: error: ...`` naming the file/flag/field and exits 2, leaving no output file; a bug
keeps its traceback.

The boundary itself (:mod:`docnmt_jax.cli`) is tested in this process; the scripts' mistakes
run through ``cli_fuzz_worker.py`` (one worker process per script, many command lines each).
"""

from __future__ import annotations

import os
import re
import shutil
import sys

import pytest
from conftest import ROOT
from test_fuzz_inputs import run_worker

from docnmt_jax import cli
from docnmt_jax.data import readers
from docnmt_jax.data.tokenizer import train_tokenizer
from docnmt_jax.errors import ConfigError, UserError

# ----------------------------------------------------------------------- the boundary itself


def _exit(capsys, fn, *args) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_:
        fn(*args)
    err = capsys.readouterr().err
    return exit_.value.code, err


@pytest.mark.parametrize(
    ("error_path", "argv_value", "users"),
    [
        ("/data/in.tsv", "/data/in.tsv", True),  # the path itself
        ("/runs/a/config.json", "/runs/a", True),  # inside a workdir the user named
        ("/out", "/out/sub/hyp.tsv", True),  # a directory above an output path
        ("/runs/ab/config.json", "/runs/a", False),  # a sibling sharing a prefix
        ("/usr/lib/x.so", "/data/in.tsv", False),  # a path the user never named
    ],
)
def test_an_os_error_is_the_users_only_on_a_path_they_gave(error_path, argv_value, users):
    error = FileNotFoundError(2, "No such file or directory", error_path)
    argv = ["prog.py", f"--input={argv_value}"]
    message = cli.user_os_error(error, argv)
    assert (message == f"{error_path}: No such file or directory") if users else message is None


def _user_mistake(argv: list[str]) -> None:
    raise ConfigError("config.train.best_mode must be min or max,\ngot 'up'")


def _bug(argv: list[str]) -> None:
    raise KeyError("an internal table lost a key")


def _unrelated_os_error(argv: list[str]) -> None:
    open("/nonexistent-internal-dir/state.bin")  # noqa: SIM115 - a path no user gave


def test_user_errors_are_one_line_with_status_2(capsys):
    code, err = _exit(capsys, cli.guarded(_user_mistake), [])
    assert code == 2
    assert err == (
        "test_error_boundary.py: error: config.train.best_mode must be min or max, got 'up'\n"
    )


def test_bugs_keep_their_traceback():
    with pytest.raises(KeyError):
        cli.guarded(_bug)([])
    with pytest.raises(FileNotFoundError):
        cli.guarded(_unrelated_os_error)([])


def test_argparse_errors_are_one_line(capsys):
    parser = cli.ArgumentParser(prog="tool.py")
    parser.add_argument("--n", type=int, required=True)
    code, err = _exit(capsys, parser.parse_args, ["--n", "x"])
    assert code == 2 and err == "tool.py: error: argument --n: invalid int value: 'x'\n"


def test_every_launch_script_uses_the_boundary():
    """No script may call app.run or argparse.ArgumentParser directly (a mistake would escape)."""
    launch = os.path.join(ROOT, "launch")
    for name in sorted(os.listdir(launch)):
        if not name.endswith(".py"):
            continue
        text = open(os.path.join(launch, name), encoding="utf-8").read()
        if "__main__" not in text:
            continue
        assert "app.run(" not in text and "argparse.ArgumentParser(" not in text, name
        if command := re.search(r"from (docnmt_jax\.commands\.\w+) import .*\brun\b", text):
            # a thin shim: the command module's run() is what must use the boundary
            module = os.path.join(ROOT, *command.group(1).split(".")) + ".py"
            text = open(module, encoding="utf-8").read()
            assert "app.run(" not in text, module
        assert "cli.run(main" in text or "cli.run_argparse(main)" in text, name


# --------------------------------------------------------------------------- the scripts


def _case(name: str, args: list[str], fragment: str, output: str | None = None) -> dict:
    return {"name": name, "args": args, "fragment": fragment, "output": output}


def _check(cases: list[dict], results: list[dict], prog: str) -> None:
    failures = []
    for case, result in zip(cases, results, strict=True):
        lines = result["stderr"].strip().splitlines()
        last = lines[-1] if lines else ""
        output = case["output"]
        leftovers = [p for p in (output, output and output + ".partial") if p and os.path.exists(p)]
        if result["traceback"] or result["code"] != 2:
            failures.append(f"{case['name']}: status {result['code']} {result['traceback'][-800:]}")
        elif not last.startswith(f"{prog}: error: ") or case["fragment"] not in last:
            failures.append(f"{case['name']}: {last!r} lacks {case['fragment']!r}")
        elif any("Traceback" in line for line in lines) or leftovers:
            failures.append(f"{case['name']}: traceback or partial output {leftovers}")
    assert not failures, "\n".join(failures)


@pytest.fixture(scope="module")
def mismatched_run(one_step_run, synthetic_dir, tmp_path_factory):
    """A copy of ``one_step_run`` whose tokenizer was replaced by one of another size."""
    workdir = str(tmp_path_factory.mktemp("mismatched") / "run")
    shutil.copytree(one_step_run, workdir)
    docs = readers.read_tsv(os.path.join(synthetic_dir, "train.tsv"))
    train_tokenizer(docs, os.path.join(workdir, "spm.model"), vocab_size=320)
    return workdir


def test_translate_mistakes(one_step_run, mismatched_run, synthetic_dir, tmp_path):
    good_in = os.path.join(synthetic_dir, "test.tsv")
    empty = tmp_path / "empty.tsv"
    empty.write_text("\n\n", encoding="utf-8")
    bad_tsv = tmp_path / "bad.tsv"
    bad_tsv.write_text("d1\tuno\tone\nd1\tdos\ttwo\textra\n", encoding="utf-8")
    a_file = tmp_path / "a_file"
    a_file.write_text("x", encoding="utf-8")
    out = str(tmp_path / "out" / "hyp.tsv")
    run = f"--workdir={one_step_run}"
    no_tokenizer = str(tmp_path / "no_tokenizer")
    shutil.copytree(one_step_run, no_tokenizer)
    os.remove(os.path.join(no_tokenizer, "spm.model"))
    cases = [
        _case("missing workdir", [f"--workdir={tmp_path}/nope", f"--input={good_in}",
              f"--output={out}"], "config.json not found", out),
        _case("missing step", [run, "--checkpoint=999", f"--input={good_in}", f"--output={out}"],
              "no checkpoint at step 999", out),
        _case("bad checkpoint", [run, "--checkpoint=last", f"--input={good_in}",
              f"--output={out}"], "--checkpoint must be best, latest, averaged or a step", out),
        _case("missing input", [run, f"--input={tmp_path}/none.tsv", f"--output={out}"],
              "none.tsv: no such file", out),
        _case("empty input", [run, f"--input={empty}", f"--output={out}"], "no documents", out),
        _case("malformed input", [run, f"--input={bad_tsv}", f"--output={out}"],
              f"{bad_tsv}:2: expected", out),
        _case("unwritable output", [run, f"--input={good_in}", f"--output={a_file}/hyp.tsv"],
              str(a_file), None),
        _case("vocabulary mismatch", [f"--workdir={mismatched_run}", f"--input={good_in}",
              f"--output={out}"], "spm.model does not fit checkpoint", out),
        _case("missing tokenizer", [f"--workdir={no_tokenizer}", f"--input={good_in}",
              f"--output={out}"], "spm.model: sentencepiece model not found", out),
        _case("unknown flag", [run, "--beams=4", f"--input={good_in}", f"--output={out}"],
              "Unknown command line flag 'beams'", out),
        _case("missing flag", [f"--input={good_in}", f"--output={out}"], "--workdir", out),
        _case("bad nbest", [run, "--beam=2", "--nbest=3", f"--input={good_in}",
              f"--output={out}"], "nbest must be between 1 and the beam size 2", out),
        _case("bad mesh", [run, "--mesh=2,x", f"--input={good_in}", f"--output={out}"],
              "DATA,FSDP,MODEL", out),
        _case("no context to draw", [run, "--random_context_seed=1", f"--input={good_in}",
              f"--output={out}"], "translates sentences alone", out),
    ]  # fmt: skip
    results = run_worker("translate.py", cases, tmp_path)
    _check(cases, results, "translate.py")


def test_train_mistakes(synthetic_dir, tmp_path):
    config = os.path.join(ROOT, "configs", "transformer.py")
    base = [
        f"--config={config}",
        f"--workdir={tmp_path}/run",
        f"--config.data.data_dir={synthetic_dir}",
        "--config.train.num_steps=1",
        "--config.data.vocab_size=300",
    ]
    cases = [
        _case("unknown key", [*base, "--config.train.nope=1"],
              "--config.train.nope: no such key in"),
        _case("unknown section", [*base, "--config.trian.num_steps=1"],
              "--config.trian.num_steps: no such key"),
        _case("bad value", [*base, "--config.train.num_steps=many"],
              "--config.train.num_steps=many"),
        _case("missing config", [f"--config={tmp_path}/none.py"], "none.py: no such file"),
        _case("metric never computed", [*base, "--config.train.best_metric=dev_accuracy"],
              "config.train.best_metric='dev_accuracy' is never computed"),
        _case("missing data", [*base, f"--config.data.data_dir={tmp_path}/no_data"],
              "train.tsv not found"),
        _case("own corpus missing", [*base, f"--config.data.train={tmp_path}/t.tsv",
              f"--config.data.dev={tmp_path}/d.tsv"], "t.tsv: corpus file not found"),
        _case("bad format", [*base, f"--config.data.train={synthetic_dir}/train.tsv",
              f"--config.data.dev={synthetic_dir}/dev.tsv", "--config.data.format=xml"],
              "unknown corpus format 'xml'"),
        _case("bad model", [*base, "--config.model.name=gpt"], "gpt"),
        _case("extra argument", [*base, "stray"], "unexpected arguments: ['stray']"),
    ]  # fmt: skip
    results = run_worker("train.py", cases, tmp_path)
    _check(cases, results, "train.py")


def test_evaluate_and_prepare_data_mistakes(one_step_run, synthetic_dir, tmp_path):
    ref = os.path.join(synthetic_dir, "test.tsv")
    cases = [
        _case("missing hyp", [f"--hyp={tmp_path}/none.tsv", f"--ref={ref}"], "none.tsv"),
        _case("no ref", [f"--hyp={ref}"], "--ref is required"),
        _case("bad contrastive format", ["--contrastive=lcd", f"--data={ref}",
              f"--workdir={one_step_run}"], "unknown format 'lcd'"),
        _case("missing contrastive set", ["--contrastive=voita", f"--data={tmp_path}/v.json",
              f"--workdir={one_step_run}"], "v.json: no such file"),
    ]  # fmt: skip
    _check(cases, run_worker("evaluate.py", cases, tmp_path), "evaluate.py")
    cases = [
        _case("unknown corpus", ["--corpus=wmt", f"--out={tmp_path}/d"], "--corpus"),
        _case("no sword modules", ["--corpus=bible", f"--sword_path={tmp_path}/sword",
              f"--out={tmp_path}/d"], "SWORD module 'spaRV1909eb' not found"),
    ]  # fmt: skip
    _check(cases, run_worker("prepare_data.py", cases, tmp_path), "prepare_data.py")


def test_argparse_scripts_mistakes(one_step_run, synthetic_dir, capsys, monkeypatch):
    """benchmark.py and analyze.py, in this process (argparse, no global flags)."""
    sys.path.insert(0, os.path.join(ROOT, "launch"))
    try:
        import analyze
        import benchmark
    finally:
        sys.path.pop(0)
    code, err = _exit(capsys, cli.run_argparse, benchmark.main, ["--sections=speed"])
    assert code == 2 and err.startswith("benchmark.py: error: unknown sections"), err
    assert len(err.strip().splitlines()) == 1
    test = os.path.join(synthetic_dir, "test.tsv")
    argv = ["attention", f"--workdir={one_step_run}", f"--input={test}", "--doc=nope"]
    code, err = _exit(capsys, cli.run_argparse, analyze.main, argv)
    assert code == 2 and err.startswith("analyze.py: error: --doc='nope' is not a document"), err
    assert issubclass(ConfigError, UserError)
