"""Readers of published contrastive test sets, one small reader per format.

Every reader returns a ``list[ContrastiveInstance]``: a current source sentence with the
source sentences before it (its context), and two or more candidate translations of it, each
with the target sentences before it (the target context, teacher-forced by a document model),
one of them right. :mod:`docnmt_jax.evaluation.contrastive` scores them with any model.

* **Voita et al. (2019), EN→RU consistency sets** (:func:`read_voita`; ``deixis_test.json``,
  ``lex_cohesion_test.json``, ``ellipsis_infl.json``, ``ellipsis_vp.json`` of
  ``good-translation-wrong-in-context/consistency_testsets``): a JSON list of objects
  ``{"src": str, "dst": [str, ...], "true_ind": int, "ctx_dist": int}``, or the same objects
  one per line (JSON Lines). ``src`` and every ``dst`` candidate hold the context sentences
  and the current one joined by the token ``_eos`` (3 context sentences in the published
  sets; any number >= 0 here): the last part is the current sentence, the parts before it
  its context, sentence ``k`` of ``src`` aligned with sentence ``k`` of every candidate.
  Breakdown attribute: ``ctx_dist``.
* **ContraPro (Müller et al. 2018), EN→DE pronouns** (:func:`read_contrapro`):
  ``contrapro.json`` (a list of objects with ``"ref pronoun"``, ``"ante distance"``,
  ``"errors": [{"contrastive": ..., "replacement": ...}, ...]``, ``"document id"``,
  ``"segment id"`` ...) and the four files its ``conversion_scripts/json2text_and_context.pl
  --context N`` writes next to it: ``PREFIX.text.{en,de}``, one line per scored variant (each
  instance's reference, then its contrastive sentences in ``errors`` order; the source line
  repeated), and ``PREFIX.context.{en,de}``, ``N`` lines per variant (oldest first; an empty
  line where the document has no sentence there). The sentences themselves come from the text
  files (which the user may have preprocessed), the grouping and attributes from the JSON.
  Breakdown attributes: ``pronoun`` (the reference pronoun, lower-cased) and
  ``ante_distance`` (``0``, ``1``, ``2``, ``3``, ``>3``; ``unknown`` when negative).
* **Bawden et al. (2018), EN→FR** (:func:`read_bawden`; ``discourse-mt-test-sets/test-sets``):
  per set (``anaphora``, ``lexical_choice``) four aligned files ``SET.current.{en,fr}`` and
  ``SET.prev.{en,fr}``, lines in pairs: line ``2i+1`` the correct translation, line ``2i+2``
  the incorrect one, both with the same current source and previous source sentence (their
  ``.prev.fr`` is the target context of each). Anaphora has blocks of 4 pairs, lexical choice
  of 2, every translation correct in one context and incorrect in another, so a context-blind
  model scores 50%. Breakdown attribute: ``set``.

A context position empty on both sides (a ContraPro context line at a document's start) is
dropped; a sentence empty on one side only stays (it is its end-of-sentence token alone).
Malformed input raises :class:`ContrastiveFormatError`, whose message is one line
``FILE:LINE: reason``; in JSON the line is where the offending instance starts.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from docnmt_jax.data.documents import CorpusFormatError
from docnmt_jax.data.readers import _read_lines
from docnmt_jax.errors import ConfigError, RunNotFoundError

PathLike = str | os.PathLike

#: The published language pair of each format (the text files' suffixes).
DEFAULT_LANGS = {"voita": ("en", "ru"), "contrapro": ("en", "de"), "bawden": ("en", "fr")}
#: The sets of the Bawden et al. repository, as ``json2rawtext.py`` names their files.
BAWDEN_SETS = ("anaphora", "lexical_choice")
ANTE_DISTANCE_BUCKETS = ("0", "1", "2", "3", ">3")

_EOS_SPLIT = re.compile(r"(?:^|\s+)_eos(?:\s+|$)")


class ContrastiveFormatError(CorpusFormatError):
    """A contrastive test set is malformed; ``str()`` is one line ``FILE:LINE: reason``."""


@dataclasses.dataclass(frozen=True)
class ContrastiveInstance:
    """One forced choice: the current sentence ``src`` after the source sentences
    ``context_src`` (oldest first); its translations ``candidates``, candidate ``c`` after the
    target sentences ``context_tgt[c]`` (aligned with ``context_src``); ``candidates[correct]``
    is the right one. ``attributes`` are the breakdown keys (``ctx_dist``, ``pronoun`` ...);
    ``where`` is ``FILE:LINE`` of the instance."""

    context_src: tuple[str, ...]
    src: str
    context_tgt: tuple[tuple[str, ...], ...]
    candidates: tuple[str, ...]
    correct: int
    attributes: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    where: str = ""

    def __post_init__(self) -> None:
        if len(self.candidates) < 2:
            raise ValueError(f"{len(self.candidates)} candidate(s); a choice needs at least 2")
        if len(self.context_tgt) != len(self.candidates):
            raise ValueError(
                f"{len(self.context_tgt)} target contexts for {len(self.candidates)} candidates"
            )
        for c, context in enumerate(self.context_tgt):
            if len(context) != len(self.context_src):
                raise ValueError(
                    f"candidate {c} has {len(context)} target context sentences but the "
                    f"source has {len(self.context_src)}"
                )
        if not 0 <= self.correct < len(self.candidates):
            raise ValueError(
                f"correct candidate {self.correct} is outside the {len(self.candidates)} candidates"
            )


def _instance(path: str, line: int, what: str, **fields: Any) -> ContrastiveInstance:
    """A :class:`ContrastiveInstance` with the context positions empty on every side dropped
    (every target context as long as the source's); its checks fail as
    :class:`ContrastiveFormatError` at ``path:line`` (``what`` names the instance)."""
    src_ctx, tgt_ctx = fields.pop("context_src"), fields.pop("context_tgt")
    keep = [
        k for k in range(len(src_ctx)) if src_ctx[k].strip() or any(t[k].strip() for t in tgt_ctx)
    ]
    try:
        return ContrastiveInstance(
            context_src=tuple(src_ctx[k] for k in keep),
            context_tgt=tuple(tuple(t[k] for k in keep) for t in tgt_ctx),
            where=f"{path}:{line}",
            **fields,
        )
    except ValueError as e:
        raise ContrastiveFormatError(path, line, f"{what}: {e}") from None


# ---------------------------------------------------------------------------------------- JSON


def _json_records(path: PathLike) -> list[tuple[int, Any]]:
    """``(line where it starts, value)`` of every element of a JSON list file, or of every
    non-blank line of a JSON Lines file (a file whose first non-blank character is not
    ``[``)."""
    path = os.fspath(path)
    text = "\n".join(_read_lines(path))
    start = len(text) - len(text.lstrip())
    if start == len(text):
        raise ContrastiveFormatError(path, 1, "empty file: expected a JSON list of instances")
    if text[start] != "[":
        records = []
        for n, line in enumerate(text.split("\n"), 1):
            if line.strip():
                try:
                    records.append((n, json.loads(line)))
                except json.JSONDecodeError as e:
                    raise ContrastiveFormatError(
                        path, n, f"invalid JSON Lines record: {e.msg} (column {e.colno})"
                    ) from None
        return records
    decoder = json.JSONDecoder()
    records, line, counted = [], 1, 0

    def skip(pos: int) -> int:
        while pos < len(text) and text[pos] in " \t\r\n":
            pos += 1
        return pos

    def fail(pos: int, reason: str) -> ContrastiveFormatError:
        return ContrastiveFormatError(path, text.count("\n", 0, pos) + 1, reason)

    pos = skip(start + 1)
    if pos < len(text) and text[pos] == "]":
        pos += 1
    else:
        while True:
            line += text.count("\n", counted, pos)
            counted = pos
            try:
                value, end = decoder.raw_decode(text, pos)
            except json.JSONDecodeError as e:
                raise ContrastiveFormatError(
                    path, e.lineno, f"invalid JSON: {e.msg} (column {e.colno})"
                ) from None
            records.append((line, value))
            pos = skip(end)
            if pos < len(text) and text[pos] == ",":
                pos = skip(pos + 1)
                continue
            if pos < len(text) and text[pos] == "]":
                pos += 1
                break
            raise fail(pos, "invalid JSON: expected ',' or ']' after an instance")
    if skip(pos) < len(text):
        raise fail(skip(pos), "invalid JSON: text after the closing ']'")
    return records


def _field(
    path: str, line: int, what: str, record: Mapping[str, Any], key: str, kind: type | tuple
) -> Any:
    if key not in record:
        raise ContrastiveFormatError(path, line, f"{what}: missing field {key!r}")
    value = record[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise ContrastiveFormatError(
            path, line, f"{what}: field {key!r} must be {names}, got {json.dumps(value)[:60]}"
        )
    return value


def _objects(path: str) -> list[tuple[int, str, Mapping[str, Any]]]:
    out = []
    for n, (line, record) in enumerate(_json_records(path)):
        what = f"instance {n}"
        if not isinstance(record, dict):
            raise ContrastiveFormatError(
                path, line, f"{what}: expected a JSON object, got {type(record).__name__}"
            )
        out.append((line, what, record))
    if not out:
        raise ContrastiveFormatError(path, 1, "no instances")
    return out


# --------------------------------------------------------------------------------- Voita


def split_eos(text: str) -> list[str]:
    """The sentences of a Voita et al. line: parts between ``_eos`` tokens, stripped."""
    return [part.strip() for part in _EOS_SPLIT.split(text.strip())]


def read_voita(path: PathLike) -> list[ContrastiveInstance]:
    """Voita et al. (2019) consistency set: a JSON list (or JSON Lines) of
    ``{"src", "dst", "true_ind", "ctx_dist"}`` (``ctx_dist`` optional)."""
    path = os.fspath(path)
    instances = []
    for line, what, record in _objects(path):
        src = split_eos(_field(path, line, what, record, "src", str))
        dst = _field(path, line, what, record, "dst", list)
        if not all(isinstance(d, str) for d in dst):
            raise ContrastiveFormatError(path, line, f"{what}: 'dst' must be a list of strings")
        true_ind = _field(path, line, what, record, "true_ind", int)
        attributes = {}
        if "ctx_dist" in record:
            attributes["ctx_dist"] = _field(path, line, what, record, "ctx_dist", int)
        candidates = [split_eos(d) for d in dst]
        for c, sentences in enumerate(candidates):
            if len(sentences) != len(src):
                raise ContrastiveFormatError(
                    path,
                    line,
                    f"{what}: candidate {c} has {len(sentences)} sentences (split on _eos) "
                    f"but 'src' has {len(src)}",
                )
        if not src[-1] or not all(s[-1] for s in candidates):
            raise ContrastiveFormatError(path, line, f"{what}: the current sentence is empty")
        instances.append(
            _instance(
                path,
                line,
                what,
                context_src=src[:-1],
                src=src[-1],
                context_tgt=[s[:-1] for s in candidates],
                candidates=tuple(s[-1] for s in candidates),
                correct=true_ind,
                attributes=attributes,
            )
        )
    return instances


# ------------------------------------------------------------------------------ ContraPro


def ante_distance_bucket(distance: int) -> str:
    """ContraPro's antecedent-distance bucket: ``0``, ``1``, ``2``, ``3``, ``>3``."""
    if distance < 0:
        return "unknown"
    return str(distance) if distance <= 3 else ">3"


def contrapro_files(json_path: PathLike, langs: Sequence[str]) -> dict[str, str]:
    """The text and context files ``json2text_and_context.pl`` writes for ``json_path``:
    keys ``text_src``, ``text_tgt``, ``context_src``, ``context_tgt``."""
    prefix = os.fspath(json_path)
    prefix = prefix[: -len(".json")] if prefix.endswith(".json") else prefix
    src, tgt = langs
    return {
        f"{kind}_{side}": f"{prefix}.{kind}.{lang}"
        for kind in ("text", "context")
        for side, lang in (("src", src), ("tgt", tgt))
    }


def _contrapro_groups(json_path: str) -> list[tuple[int, str, int, str, int]]:
    """Per instance of ``contrapro.json``: (line, what, variants, pronoun, distance)."""
    groups = []
    for line, what, record in _objects(json_path):
        errors = _field(json_path, line, what, record, "errors", list)
        if not errors or not all(isinstance(e, dict) and "contrastive" in e for e in errors):
            raise ContrastiveFormatError(
                json_path,
                line,
                f"{what}: 'errors' must be a non-empty list of objects with "
                "a 'contrastive' sentence",
            )
        pronoun = _field(json_path, line, what, record, "ref pronoun", str)
        distance = _field(json_path, line, what, record, "ante distance", int)
        groups.append((line, what, 1 + len(errors), pronoun, distance))
    return groups


def _contrapro_context_lines(
    json_path: str, files: dict[str, str], lines: dict[str, list[str]], variants: int
) -> int:
    """Check the text files hold one line per variant and the context files N per variant;
    return N."""
    for key in ("text_src", "text_tgt"):
        n = len(lines[key])
        if n != variants:
            raise ContrastiveFormatError(
                files[key],
                max(1, min(n, variants + 1)),
                f"{n} lines, but {json_path} has {variants} variants (each instance's "
                "reference and contrastive sentences): the files do not belong together",
            )
    n_context = len(lines["context_src"])
    if n_context % variants or len(lines["context_tgt"]) != n_context:
        bad = "context_src" if n_context % variants else "context_tgt"
        raise ContrastiveFormatError(
            files[bad],
            max(1, len(lines[bad])),
            f"{len(lines[bad])} lines: expected N per variant ({variants} variants) and as many "
            f"as {files['context_src' if bad == 'context_tgt' else 'context_tgt']}",
        )
    return n_context // variants


def read_contrapro(
    json_path: PathLike, langs: Sequence[str] = DEFAULT_LANGS["contrapro"]
) -> list[ContrastiveInstance]:
    """ContraPro: ``contrapro.json`` with the text and context files beside it
    (:func:`contrapro_files`; any number of context lines per variant, the same for all)."""
    json_path = os.fspath(json_path)
    files = contrapro_files(json_path, langs)
    missing = [p for p in files.values() if not os.path.exists(p)]
    if missing:
        raise RunNotFoundError(
            f"{json_path}: missing {', '.join(missing)} (write them with ContraPro's "
            "conversion_scripts/json2text_and_context.pl --context N)"
        )
    groups = _contrapro_groups(json_path)
    lines = {key: _read_lines(p) for key, p in files.items()}
    per = _contrapro_context_lines(json_path, files, lines, sum(g[2] for g in groups))
    instances, v0 = [], 0
    for line, what, count, pronoun, distance in groups:
        rows = range(v0, v0 + count)
        src = lines["text_src"][v0]
        src_ctx = lines["context_src"][v0 * per : (v0 + 1) * per]
        for v in rows:
            if lines["text_src"][v] != src:
                raise ContrastiveFormatError(
                    files["text_src"],
                    v + 1,
                    f"{what} ({json_path}:{line}): source differs from its reference's (line "
                    f"{v0 + 1}); every variant repeats the source",
                )
            if lines["context_src"][v * per : (v + 1) * per] != src_ctx:
                raise ContrastiveFormatError(
                    files["context_src"],
                    v * per + 1,
                    f"{what} ({json_path}:{line}): source context differs from its "
                    f"reference's (line {v0 * per + 1})",
                )
        instances.append(
            _instance(
                json_path,
                line,
                what,
                context_src=src_ctx,
                src=src,
                context_tgt=[lines["context_tgt"][v * per : (v + 1) * per] for v in rows],
                candidates=tuple(lines["text_tgt"][v] for v in rows),
                correct=0,
                attributes={
                    "pronoun": pronoun.lower(),
                    "ante_distance": ante_distance_bucket(distance),
                },
            )
        )
        v0 += count
    return instances


# --------------------------------------------------------------------------------- Bawden


def bawden_prefixes(path: PathLike, langs: Sequence[str]) -> list[str]:
    """The set prefixes of ``path``: ``DIR/anaphora`` and ``DIR/lexical_choice`` for a
    directory (those present), or ``path`` itself (``PREFIX.current.SRC`` must exist)."""
    path = os.fspath(path)
    src = langs[0]
    if os.path.isdir(path):
        found = [
            os.path.join(path, name)
            for name in (*BAWDEN_SETS, "lexical-choice")
            if os.path.exists(os.path.join(path, f"{name}.current.{src}"))
        ]
        if not found:
            raise RunNotFoundError(
                f"{path}: no {' or '.join(f'{n}.current.{src}' for n in BAWDEN_SETS)} in this "
                "directory"
            )
        return found
    if not os.path.exists(f"{path}.current.{src}"):
        raise RunNotFoundError(
            f"{path}: neither a directory nor the prefix of {path}.current.{src}"
        )
    return [path]


def read_bawden(
    path: PathLike, langs: Sequence[str] = DEFAULT_LANGS["bawden"]
) -> list[ContrastiveInstance]:
    """Bawden et al. (2018): every set under ``path`` (:func:`bawden_prefixes`), pairs of
    lines (correct, incorrect), attribute ``set`` = the file prefix's name."""
    instances = []
    for prefix in bawden_prefixes(path, langs):
        name = os.path.basename(prefix).replace("-", "_")
        files = {
            f"{kind}_{side}": f"{prefix}.{kind}.{lang}"
            for kind in ("current", "prev")
            for side, lang in zip(("src", "tgt"), langs, strict=True)
        }
        lines = {key: _read_lines(p) for key, p in files.items()}
        n = len(lines["current_src"])
        for key, values in lines.items():
            if len(values) != n:
                raise ContrastiveFormatError(
                    files[key],
                    max(1, min(len(values), n + 1)),
                    f"{len(values)} lines but {files['current_src']} has {n}",
                )
        if n == 0 or n % 2:
            raise ContrastiveFormatError(
                files["current_src"],
                max(1, n),
                f"{n} lines: expected pairs of lines (correct, then incorrect translation)",
            )
        for i in range(0, n, 2):
            what = f"pair {i // 2} of {name}"
            for key in ("current_src", "prev_src"):
                if lines[key][i] != lines[key][i + 1]:
                    raise ContrastiveFormatError(
                        files[key],
                        i + 2,
                        f"{what}: source differs from line {i + 1}; the correct and the "
                        "incorrect translation of a pair share their source",
                    )
            if not lines["current_src"][i].strip():
                raise ContrastiveFormatError(files["current_src"], i + 1, "empty sentence")
            instances.append(
                _instance(
                    files["current_src"],
                    i + 1,
                    what,
                    context_src=[lines["prev_src"][i]],
                    src=lines["current_src"][i],
                    context_tgt=[[lines["prev_tgt"][i]], [lines["prev_tgt"][i + 1]]],
                    candidates=(lines["current_tgt"][i], lines["current_tgt"][i + 1]),
                    correct=0,
                    attributes={"set": name},
                )
            )
    return instances


# -------------------------------------------------------------------------------- formats

READERS: dict[str, Callable[..., list[ContrastiveInstance]]] = {
    "voita": lambda path, langs: read_voita(path),
    "contrapro": read_contrapro,
    "bawden": read_bawden,
}


def read_contrastive_set(
    fmt: str, path: PathLike, langs: Sequence[str] | None = None
) -> list[ContrastiveInstance]:
    """The instances of the set ``path`` in format ``fmt`` (``voita``, ``contrapro`` or
    ``bawden``); ``langs`` ``(src, tgt)`` are the file suffixes (default: the published
    pair, :data:`DEFAULT_LANGS`). Raises ValueError for an unknown format,
    FileNotFoundError for missing files and :class:`ContrastiveFormatError`."""
    if fmt not in READERS:
        raise ConfigError(f"unknown contrastive set format {fmt!r}; known: {', '.join(READERS)}")
    if not os.path.exists(path) and fmt != "bawden":
        raise RunNotFoundError(f"{os.fspath(path)}: no such file")
    langs = tuple(langs) if langs else DEFAULT_LANGS[fmt]
    if len(langs) != 2 or not all(langs):
        raise ConfigError(f"languages must be two suffixes SRC,TGT, got {','.join(langs)!r}")
    return READERS[fmt](path, langs)
