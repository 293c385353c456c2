"""Writes a parameters-only release of a trained run (and, with --stablehlo, its exported search).

    python launch/export.py --workdir runs/NAME --out releases/NAME \\
        [--checkpoint best|latest|averaged|STEP] [--params auto|ema|raw] [--overwrite]
        [--stablehlo [--platforms cpu,cuda]]
    python launch/export.py --workdir runs/NAME --out ct2/NAME --format ctranslate2 \\
        [--quantization int8|int8_float32|float16] [--checkpoint ...] [--params ...]

The release directory (docs/export.md; :mod:`docnmt_jax.export.release`) holds the chosen
checkpoint's parameters alone in ``params.npz`` (no optimiser state: numpy reads it without
the training state's structure), ``config.json``, the tokenizer ``spm.model`` and the
manifest ``release.json`` (format version, model, source step, parameter set, parameter
count, dtype, sha256 of every file). ``translate.py``, ``evaluate.py`` and ``analyze.py``
take it as ``--workdir`` (with the default ``--checkpoint``). ``--stablehlo`` (the sentence
Transformer only) adds ``stablehlo/``: the encoder and decoder step as ``jax.export``
artifacts and StableHLO, ``model.json`` and ``greedy.py``, a greedy translator that needs
only numpy, jax and sentencepiece (:mod:`docnmt_jax.export.stablehlo`).

The directory is written to ``OUT.tmp`` and renamed onto ``OUT`` when complete; a non-empty
``OUT`` is refused unless ``--overwrite`` (which replaces only an earlier release).

``--format ctranslate2`` writes a CTranslate2 model directory of the sentence Transformer
instead (the optional ``ctranslate2`` package; :mod:`docnmt_jax.export.ctranslate2`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil

from docnmt_jax import __version__, cli
from docnmt_jax.errors import RunNotFoundError, UserError
from docnmt_jax.export import release

MB = 1e6
#: Platforms ``--platforms`` may name (jax.export's names).
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")


def _parser() -> argparse.ArgumentParser:
    p = cli.ArgumentParser(
        prog="export.py", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--workdir", required=True, help="the training run (or a release)")
    p.add_argument("--out", required=True, help="the release directory to write")
    p.add_argument("--checkpoint", default="best", help="best, latest, averaged or a step number")
    p.add_argument(
        "--params",
        default="auto",
        choices=("auto", "ema", "raw"),
        help="the EMA when the run keeps one (auto), the EMA, or the raw parameters",
    )
    p.add_argument("--overwrite", action="store_true", help="replace a release at --out")
    p.add_argument(
        "--stablehlo",
        action="store_true",
        help="also export the encoder and decoder step to OUT/stablehlo (sentence Transformer)",
    )
    p.add_argument(
        "--platforms",
        default="cpu,cuda",
        help="with --stablehlo: platforms to lower for, comma-separated (cpu, cuda, rocm, tpu)",
    )
    p.add_argument(
        "--training_record",
        help="a JSON file whose object the manifest keeps as 'training' (how the model was "
        "trained: commit, command, steps, tokens, dev and test scores)",
    )
    p.add_argument(
        "--format",
        default="release",
        choices=("release", "ctranslate2"),
        help="release: this library's release directory; ctranslate2: a CTranslate2 model "
        "directory (sentence Transformer; pip install -e .[ctranslate2])",
    )
    p.add_argument(
        "--quantization",
        choices=("int8", "int8_float32", "float16"),
        help="with --format ctranslate2: the weights' type (default float32)",
    )
    return p


def _release_config(workdir: str) -> tuple[dict, str]:
    """The run's config with ``data.tokenizer`` cleared, and the tokenizer path it named."""
    with open(os.path.join(workdir, release.CONFIG_FILE), encoding="utf-8") as f:
        config = json.load(f)
    tokenizer = config.get("data", {}).get("tokenizer", "") or ""
    if "data" in config:
        config["data"]["tokenizer"] = ""
    return config, tokenizer


def parse_platforms(text: str) -> tuple[str, ...]:
    """``"cpu,cuda"`` -> ``("cpu", "cuda")``; an unknown or missing platform is an error."""
    platforms = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [p for p in platforms if p not in PLATFORMS]
    if unknown or not platforms:
        raise UserError(f"--platforms={text!r}: expected some of {', '.join(PLATFORMS)}")
    return platforms


def write_release(args: argparse.Namespace, staging: str) -> dict:
    """Writes the release of ``args.workdir`` into ``staging``; returns its manifest."""
    from docnmt_jax.export import stablehlo
    from docnmt_jax.training import restore

    model, tokenizer, _ = restore.load_model(args.workdir)
    if args.stablehlo:  # before the parameters load: another model is refused at once
        stablehlo.check_exportable(model)
    step, parameter_set = restore.selected_parameters(args.workdir, args.checkpoint, args.params)
    params, _ = restore.load_params(
        model, args.workdir, args.checkpoint, tokenizer.model_path, args.params
    )
    flat = release.flatten_params(params)
    count, dtype = release.write_params(os.path.join(staging, release.PARAMS_FILE), flat)
    config, tokenizer_source = _release_config(args.workdir)
    with open(os.path.join(staging, release.CONFIG_FILE), "w", encoding="utf-8") as f:
        f.write(json.dumps(config, indent=2) + "\n")
    shutil.copyfile(tokenizer.model_path, os.path.join(staging, release.TOKENIZER_FILE))
    if args.stablehlo:
        stablehlo.export_greedy(
            model,
            params,
            os.path.join(staging, release.STABLEHLO_DIR),
            platforms=parse_platforms(args.platforms),
        )
    source = release.read_manifest(args.workdir) if release.is_release(args.workdir) else {}
    info = {
        "model": model.name,
        "run": source.get("run", os.path.basename(os.path.normpath(args.workdir))),
        "source_workdir": source.get("source_workdir", os.path.abspath(args.workdir)),
        "source_step": step,
        "checkpoint": source.get("checkpoint", args.checkpoint),
        "parameter_set": parameter_set,
        "parameter_count": count,
        "dtype": dtype,
        "vocab_size": tokenizer.vocab_size,
        "tokenizer_source": source.get("tokenizer_source", tokenizer_source),
        "stablehlo": args.stablehlo,
        "docnmt_jax_version": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    training = read_training_record(args.training_record) or source.get("training")
    if training:
        info["training"] = training
    return release.write_manifest(staging, info)


def read_training_record(path: str | None) -> dict | None:
    """The JSON object of ``--training_record`` (one-line errors for a missing file or
    anything but an object)."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except FileNotFoundError:
        raise UserError(f"--training_record={path}: no such file") from None
    except json.JSONDecodeError as e:
        raise UserError(f"--training_record={path}: not JSON ({e})") from None
    if not isinstance(record, dict):
        raise UserError(f"--training_record={path}: expected a JSON object")
    return record


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not os.path.isdir(args.workdir):
        raise RunNotFoundError(f"--workdir={args.workdir}: no such directory")
    if args.format == "ctranslate2":
        from docnmt_jax.export import ctranslate2

        return ctranslate2.export(args)
    if args.quantization:
        raise UserError("--quantization applies to --format ctranslate2 only")
    if args.stablehlo:
        parse_platforms(args.platforms)
    read_training_record(args.training_record)  # a bad file fails before any work
    release.check_target(args.out, args.workdir, args.overwrite)
    staging = release.staging_dir(args.out)
    try:
        manifest = write_release(args, staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    release.commit(staging, args.out)
    size, run_size = release.directory_bytes(args.out), release.directory_bytes(args.workdir)
    print(
        f"wrote {args.out}: {manifest['model']} step {manifest['source_step']}, "
        f"{manifest['parameter_set']} parameters ({manifest['parameter_count']:,}, "
        f"{manifest['dtype']}); {size / MB:.2f} MB (the workdir {args.workdir}: "
        f"{run_size / MB:.2f} MB)"
    )
    return 0


def run() -> None:
    """The ``docnmt-export`` command (``python launch/export.py``)."""
    cli.run_argparse(main)


if __name__ == "__main__":
    run()
