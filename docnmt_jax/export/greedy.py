"""Greedy translation with the StableHLO export of a sentence Transformer, standalone.

    python DIR/stablehlo/greedy.py DIR/stablehlo < sentences.txt > translations.txt

``launch/export.py --stablehlo`` writes ``DIR/stablehlo/`` (:mod:`docnmt_jax.export.stablehlo`)
and copies this file there: it imports only numpy, jax (``jax.export.deserialize``) and
sentencepiece, never docnmt_jax, flax or the model code, so it runs anywhere those three are
installed, from the artifacts alone. It is also an example for a driver in another runtime.

Decoding is the library's beam search with ``beam_size=1, alpha=0`` (argmax decoding): the
source is the sentencepiece ids plus EOS; every step takes the most probable token that is
not PAD or BOS; a sentence ends at its first EOS, or with EOS forced as its
``min(max_len, floor(len_a * source_tokens + len_b))``-th token (source tokens including
EOS). One line in, one translation out.

Nothing is read unchecked: every file ``model.json`` names must be a plain name inside
``stablehlo/`` or the release's own ``../params.npz`` / ``../spm.model`` (never another
absolute or ``..`` path, nor a link out of the release), and ``model.json`` and every file
it names must match the sha256 the release's ``release.json`` lists; else a one-line error
naming the file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import sentencepiece as spm
from jax import export

FORMAT = "docnmt_jax-stablehlo-greedy"
FORMAT_VERSION = 1
SPEC_FILE = "model.json"
MANIFEST = "release.json"
#: The release's files that model.json names outside its own directory.
RELEASE_FILES = ("../params.npz", "../spm.model")


def _deserialize(path: str) -> export.Exported:
    with open(path, "rb") as f:
        return export.deserialize(bytearray(f.read()))


class CheckedFiles:
    """The files of the export in ``directory`` (a release's ``stablehlo/``), each checked
    against the release manifest beside it before it is read."""

    def __init__(self, directory: str):
        self.directory = os.path.abspath(directory)
        self.release = os.path.dirname(self.directory)
        manifest = os.path.join(self.release, MANIFEST)
        try:
            with open(manifest, encoding="utf-8") as f:
                self.files = json.load(f)["files"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{manifest}: no release manifest beside the export ({e})") from None

    def path(self, name: Any) -> str:
        """The checked path of ``name`` as ``model.json`` gives it."""
        if name in RELEASE_FILES:
            key = name[3:]
        elif (
            isinstance(name, str)
            and name not in ("", ".", "..")
            and not any(c in name for c in "/\\\0")
            and not os.path.isabs(name)
        ):
            key = f"{os.path.basename(self.directory)}/{name}"
        else:
            raise ValueError(f"{self.directory}/{SPEC_FILE}: {name!r} is not a file of the release")
        path = os.path.join(self.release, *key.split("/"))
        if not os.path.realpath(path).startswith(os.path.realpath(self.release) + os.sep):
            raise ValueError(f"{path}: a link out of the release directory")
        entry = self.files.get(key) if isinstance(self.files, dict) else None
        if not isinstance(entry, dict):
            raise ValueError(f"{path}: not listed in {MANIFEST}")
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        if entry.get("sha256") != digest.hexdigest():
            raise ValueError(f"{path}: sha256 differs from {MANIFEST}'s (the file is corrupt)")
        return path


class GreedyTranslator:
    """The exported encoder and decoder step of ``directory`` (its ``model.json``), driven
    greedily over batches of at most ``batch_size`` sentences."""

    def __init__(self, directory: str, batch_size: int = 64):
        files = CheckedFiles(directory)
        with open(files.path(SPEC_FILE), encoding="utf-8") as f:
            self.spec: dict[str, Any] = json.load(f)
        if (self.spec.get("format"), self.spec.get("format_version")) != (FORMAT, FORMAT_VERSION):
            raise ValueError(f"{directory}: not a {FORMAT} v{FORMAT_VERSION} export")
        self.batch_size = batch_size
        encode = _deserialize(files.path(self.spec["encode"]["file"]))
        step = _deserialize(files.path(self.spec["decode_step"]["file"]))
        self._encode = jax.jit(encode.call)
        self._step = jax.jit(step.call)
        params = self.spec["params"]
        with np.load(files.path(params["file"]), allow_pickle=False) as npz:
            self.params = [jnp.asarray(npz[name]) for name in params["names"]]
        self.processor = spm.SentencePieceProcessor(model_file=files.path(self.spec["tokenizer"]))
        self.eos_id = int(self.spec["ids"]["eos"])

    def source_ids(self, sentence: str) -> list[int]:
        """The model's input for ``sentence``: its piece ids, then EOS."""
        return list(self.processor.encode(sentence)) + [self.eos_id]

    def output_limit(self, source_tokens: int) -> int:
        """Output tokens allowed (EOS included) for a source of ``source_tokens`` (EOS
        included): ``clip(floor(len_a * source_tokens + len_b), 1, max_len)``."""
        rule = self.spec["output_limit"]
        limit = math.floor(rule["len_a"] * source_tokens + rule["len_b"])
        return int(min(max(limit, 1), rule["max_len"]))

    def greedy_ids(self, sources: Sequence[Sequence[int]]) -> list[list[int]]:
        """Output ids of every source (ids ending in EOS), each ending in EOS."""
        outputs: list[list[int]] = []
        for start in range(0, len(sources), self.batch_size):
            outputs.extend(self._greedy_batch(sources[start : start + self.batch_size]))
        return outputs

    def translate(self, sentences: Sequence[str]) -> list[str]:
        """Detokenised greedy translations of ``sentences``."""
        outputs = self.greedy_ids([self.source_ids(s) for s in sentences])
        return [self.processor.decode([i for i in ids if i != self.eos_id]) for ids in outputs]

    def _empty_cache(self, rows: int, length: int) -> list[jax.Array]:
        sizes = {"b": rows, "l": length}
        return [
            jnp.full([sizes.get(d, d) for d in leaf["shape"]], leaf["init"], leaf["dtype"])
            for leaf in self.spec["decode_step"]["cache"]
        ]

    def _greedy_batch(self, sources: Sequence[Sequence[int]]) -> list[list[int]]:
        rows, width = len(sources), max(len(s) for s in sources)
        src = np.zeros((rows, width), np.int32)
        for i, ids in enumerate(sources):
            src[i, : len(ids)] = ids
        limits = np.array([self.output_limit(len(s)) for s in sources])
        extra = self._encode(self.params, src, (src != self.spec["ids"]["pad"]).astype(np.int32))
        cache = self._empty_cache(rows, int(limits.max()))
        tokens = np.full(rows, self.spec["ids"]["bos"], np.int32)
        outputs: list[list[int]] = [[] for _ in sources]
        done = np.zeros(rows, bool)
        for t in range(int(limits.max())):
            logits, cache = self._step(self.params, cache, tokens, extra)
            logits = np.array(logits, np.float32)
            logits[:, self.spec["never_generated"]] = -np.inf
            tokens = np.where(t + 1 >= limits, self.eos_id, np.argmax(logits, -1)).astype(np.int32)
            for i in np.flatnonzero(~done):
                outputs[i].append(int(tokens[i]))
            done |= tokens == self.eos_id
            if done.all():
                break
        return outputs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", help="the stablehlo/ directory of a release")
    parser.add_argument("--batch_size", type=int, default=64, help="sentences per batch")
    args = parser.parse_args(argv)
    try:
        translator = GreedyTranslator(args.directory, args.batch_size)
    except (ValueError, OSError, KeyError) as e:  # one line, no traceback
        print(f"greedy.py: error: {e}", file=sys.stderr)
        return 2
    sentences = [line.rstrip("\n") for line in sys.stdin]
    for translation in translator.translate(sentences):
        print(translation)
    return 0


if __name__ == "__main__":
    sys.exit(main())
