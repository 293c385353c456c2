"""The everyday handles, through the installed command and the public API: ``docnmt-translate``
in a real pipe (standard input to standard output, the input's format kept, line for line),
``--interactive`` line by line with the document's earlier sentences as context, ``--nbest``
and ``--sample`` rows, and ``docnmt_jax.load(...).translate/score`` on plain strings."""

from __future__ import annotations

import os
import select
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import tiny_final_config

import docnmt_jax
from docnmt_jax.data import readers
from docnmt_jax.data.documents import Document
from docnmt_jax.data.tokenizer import BOS_ID, EOS_ID
from docnmt_jax.decoding.search import SearchConfig, memory_from_best
from docnmt_jax.errors import UserError
from docnmt_jax.training import restore, trainer

BIN = os.path.dirname(sys.executable)
GREEDY = ["--beam=1", "--alpha=0"]


def _translate_cmd(*args: str, stdin: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [os.path.join(BIN, "docnmt-translate"), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def final_run(synthetic_dir, tmp_path_factory):
    """A FINAL workdir (chunks of 4 sentences, memory and global context), two steps."""
    workdir = str(tmp_path_factory.mktemp("final_run"))
    trainer.train_and_evaluate(tiny_final_config(synthetic_dir, num_steps=2), workdir)
    return workdir


def _library_translation(workdir: str, documents: list[list[str]]) -> list[list[str]]:
    """The reference: the library's translator on the same documents (greedy)."""
    search = SearchConfig(beam_size=1, alpha=0.0)
    translator, _ = restore.load_translator(workdir, "best", search)
    docs = [Document(str(i), tuple(d), ("",) * len(d)) for i, d in enumerate(documents)]
    return translator.translate(docs)


def test_plain_text_pipe_keeps_lines(one_step_run, synthetic_dir):
    docs = readers.read_tsv(os.path.join(synthetic_dir, "test.tsv"))[:3]
    sentences = [list(d.src[:3]) for d in docs]
    # a leading blank line, one and two blank lines between documents
    text = "\n" + "\n".join(sentences[0]) + "\n\n" + "\n".join(sentences[1]) + "\n\n\n"
    text += "\n".join(sentences[2]) + "\n"
    out = _translate_cmd(f"--workdir={one_step_run}", *GREEDY, stdin=text)
    assert out.returncode == 0, out.stderr[-2000:]
    expected = _library_translation(one_step_run, sentences)
    lines = out.stdout.split("\n")[:-1]
    assert len(lines) == len(text.split("\n")) - 1, "one output line per input line"
    for k, line in enumerate(text.split("\n")[:-1]):
        if not line:
            assert lines[k] == ""
    assert [x for x in lines if x] == [h for doc in expected for h in doc if h]
    assert "wrote standard output" in out.stderr and "doc_id" not in out.stdout


@pytest.mark.slow
def test_nbest_and_sampling_rows(one_step_run, synthetic_dir):
    docs = readers.read_tsv(os.path.join(synthetic_dir, "test.tsv"))[:1]
    tsv = "".join(f"{d.doc_id}\t{s}\n" for d in docs for s in d.src[:2])
    out = _translate_cmd(f"--workdir={one_step_run}", "--beam=3", "--nbest=3", stdin=tsv)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [r.split("\t") for r in out.stdout.splitlines()]
    assert rows[0] == ["doc_id", "sentence", "rank", "hyp", "log_prob", "score"]
    assert [(r[1], r[2]) for r in rows[1:]] == [(str(k), str(n)) for k in (0, 1) for n in (1, 2, 3)]
    for k in (0, 1):
        scores = [float(r[5]) for r in rows[1:] if r[1] == str(k)]
        assert scores == sorted(scores, reverse=True)
    sampled = [
        _translate_cmd(f"--workdir={one_step_run}", "--sample", "--seed=4", stdin=tsv).stdout
        for _ in range(2)
    ]
    assert sampled[0] == sampled[1] and len(sampled[0].splitlines()) == 3
    docs = readers.read_tsv(os.path.join(synthetic_dir, "test.tsv"))[:3]
    tsv = "".join(f"{d.doc_id}\t{s}\n" for d in docs for s in d.src[:3])
    expected = _library_translation(one_step_run, [list(d.src[:3]) for d in docs])
    out = _translate_cmd(f"--workdir={one_step_run}", *GREEDY, stdin=tsv)  # TSV in, TSV out
    assert out.returncode == 0, out.stderr[-2000:]
    rows = out.stdout.splitlines()
    assert rows[0] == "doc_id\thyp"
    assert [r.split("\t")[0] for r in rows[1:]] == [d.doc_id for d in docs for _ in d.src[:3]]
    assert [r.split("\t", 1)[1] for r in rows[1:]] == [h for doc in expected for h in doc]
    as_text = _translate_cmd(
        f"--workdir={one_step_run}", *GREEDY, "--output_format=text", stdin=tsv
    )
    blocks = as_text.stdout.rstrip("\n").split("\n\n")
    assert [b.split("\n") for b in blocks] == expected
    refused = _translate_cmd(f"--workdir={one_step_run}", "--beam=2", "--nbest=3", stdin=tsv)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1


def _interactive(workdir: str, lines: list[list[str]]) -> list[list[str]]:
    """The answers of ``docnmt-translate --interactive`` in a real pipe, each line read
    before the next is written (so each answer was flushed on its own)."""
    proc = subprocess.Popen(
        [os.path.join(BIN, "docnmt-translate"), f"--workdir={workdir}", "--interactive"] + GREEDY,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
    )
    answers: list[list[str]] = []
    try:
        for document in lines:
            answers.append([])
            for sentence in document:
                proc.stdin.write(sentence + "\n")
                proc.stdin.flush()
                ready, _, _ = select.select([proc.stdout], [], [], 600)
                assert ready, "no answer to a line within 600 s"
                answers[-1].append(proc.stdout.readline().rstrip("\n"))
            proc.stdin.write("\n")
            proc.stdin.flush()
            assert proc.stdout.readline() == "\n"  # the blank line is echoed
        proc.stdin.close()
        assert proc.wait(timeout=600) == 0, proc.stderr.read()[-2000:]
    finally:
        proc.kill()
    return answers


def test_interactive_answers_each_line_as_it_arrives(one_step_run, synthetic_dir):
    docs = readers.read_tsv(os.path.join(synthetic_dir, "test.tsv"))
    lines = [list(docs[0].src[:3]), list(docs[1].src[:2])]
    answers = _interactive(one_step_run, lines)
    assert answers == _library_translation(one_step_run, lines)  # a sentence model


@pytest.mark.slow
def test_interactive_keeps_the_target_memory(final_run, synthetic_dir):
    """FINAL (chunks of 4 sentences) line by line: past-only context and each document's
    kept target memory, two documents crossing a chunk boundary."""
    docs = readers.read_tsv(os.path.join(synthetic_dir, "test.tsv"))
    lines = [list(docs[0].src[:6]), list(docs[1].src[:2])]
    answers = _interactive(final_run, lines)
    for document, got in zip(lines, answers, strict=True):
        assert got == _naive_next_sentences(final_run, document)
        # a chunk's first sentence has no memory: the translation of its chunk so far
        firsts = _library_translation(final_run, [document[:1], document[4:5]])
        assert [got[0], got[4:5]] == [firsts[0][0], firsts[1][:1]]


def _naive_next_sentences(workdir: str, document: list[str]) -> list[str]:
    """The reference of the interactive translation of a FINAL document: one document, one
    sentence at a time, in chunks of S from its start; slot k of the chunk so far searched
    with the memory the previous search left, carried as it is (no batching, no padding)."""
    search = SearchConfig(beam_size=1, alpha=0.0)
    translator, _ = restore.load_translator(workdir, "best", search)
    model, S = translator.model, translator.pipeline_config.sentences_per_chunk
    out, memory = [], None
    for n in range(len(document)):
        chunk = document[n // S * S : n + 1]
        (batch,) = translator.batches([Document("d", tuple(chunk), ("",) * len(chunk))])
        slots, empty = model.search_inputs(translator.params, batch, search)
        k = len(chunk) - 1
        assert batch["doc_index"][0] == 0  # the document's row comes first
        slot = jax.tree.map(lambda x, k=k: x[k, :1], slots)
        first_row = jax.tree.map(lambda x: x[:1], empty)
        result = model.search_slot(
            translator.params, first_row if len(chunk) == 1 else memory, slot, search
        )
        memory = memory_from_best(result)
        out.append(translator.tokenizer.decode(np.asarray(result.sequences[0, 0])))
    return out


def test_python_api_on_plain_strings(one_step_run, synthetic_dir):
    docs = readers.read_tsv(os.path.join(synthetic_dir, "test.tsv"))[:2]
    sentences = [list(d.src[:3]) for d in docs]
    model = docnmt_jax.load(one_step_run)
    got = model.translate(sentences, beam=1, alpha=0.0)
    assert got == _library_translation(one_step_run, sentences)
    whole = model.translate([docs[0]], beam=1, alpha=0.0)  # a Document as it is
    assert whole == _library_translation(one_step_run, [list(docs[0].src)])
    assert model.translate([sentences[0][0]], beam=1, alpha=0.0) == [[got[0][0]]]
    with pytest.raises(UserError, match="unknown search option"):
        model.translate(sentences, beem=2)
    with pytest.raises(UserError, match="list of documents"):
        model.translate("one string")


@pytest.mark.slow
def test_python_api_scores_and_nbest(one_step_run, synthetic_dir):
    docs = readers.read_tsv(os.path.join(synthetic_dir, "test.tsv"))[:2]
    sentences = [list(d.src[:3]) for d in docs]
    model = docnmt_jax.load(one_step_run)
    # teacher-forced scores against a naive loop over the incremental decoder
    sources = [s for doc in sentences for s in doc]
    targets = [d.tgt[k] for d in docs for k in range(3)]
    scores = model.score(sentences, [list(d.tgt[:3]) for d in docs])
    for got_score, source, target in zip(
        [x for doc in scores for x in doc], sources, targets, strict=True
    ):
        assert got_score == pytest.approx(_naive_log_prob(model, source, target), abs=2e-3)
    nbest = model.translate(sentences, beam=2, nbest=2)
    best = model.translate(sentences, beam=2)
    for doc_lists, doc_best in zip(nbest, best, strict=True):
        for hyps, text in zip(doc_lists, doc_best, strict=True):
            assert hyps[0].text == text and hyps[0].score >= hyps[-1].score


def _naive_log_prob(model, source: str, target: str) -> float:
    """``log p(target | source)`` of a sentence Transformer, one decoder step at a time
    (the search's incremental decoder, not the training forward pass), in float64 sums."""
    module, tok = model.model.eval_module, model.tokenizer
    variables = {"params": model.translator(SearchConfig()).params}
    src = np.array([tok.encode(source) + [EOS_ID]])
    tgt = tok.encode(target) + [EOS_ID]
    encoded = module.apply(variables, src, (src > 0).astype(np.int32), method=module.encode)
    extra = module.apply(
        variables, encoded, (src > 0).astype(np.int32), method=module.decode_inputs
    )
    cache = module.apply(variables, 1, len(tgt), method=module.init_cache)
    total, previous = 0.0, BOS_ID
    for token in tgt:
        logits, cache = module.apply(
            variables, cache, np.array([previous]), extra, method=module.decode_step
        )
        total += float(np.asarray(jax.nn.log_softmax(logits[0].astype(np.float32)))[token])
        previous = token
    return total
