"""Does a model use the context? Train it on the synthetic context task and score the labels.

:func:`make_corpus` writes the synthetic corpus (default generator settings), :func:`proof_config`
points a config at it with size and step overrides (:data:`TINY`: a tiny model that learns the
task in a few CPU minutes; dev BLEU off, best checkpoint by dev loss), :func:`warm_start`
optionally trains the :data:`CURRICULUM` stages first, and :func:`run` trains the config with
``train_and_evaluate``, translates the test split greedily and scores it with
:func:`~docnmt_jax.data.synthetic.context_accuracy` (overall, per phenomenon and per sentence
distance, with the chance level), :func:`candidate_accuracy` and the teacher-forced forced
choice (:func:`~docnmt_jax.evaluation.contrastive.contrastive_accuracy`); :func:`markdown`
formats the scores. A sentence-level model (``configs/transformer.py``) sees no context and
stays at chance; FINAL sees the whole chunk and can reach 100%.

Command line (:func:`main`): ``python launch/context_proof.py --config configs/final.py
--workdir runs/proof_final`` generates the synthetic corpus (default generator settings) into
``WORKDIR/data`` unless ``--data_dir`` names one, trains the config there (size and step
overrides as flags; ``--tiny`` starts from :data:`TINY`), translates the test split greedily
and prints the scores as markdown tables, with the chance level.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import ml_collections

from docnmt_jax import cli
from docnmt_jax.config_files import load_config
from docnmt_jax.data import synthetic
from docnmt_jax.data.tokenizer import get_or_train_tokenizer, load_tokenizer
from docnmt_jax.decoding.search import SearchConfig
from docnmt_jax.evaluation import contrastive
from docnmt_jax.files import write_atomic
from docnmt_jax.models import build_model
from docnmt_jax.training import data_setup, dev_eval, restore, trainer

# Settings a tiny model learns the task with in a few CPU minutes (see tests/test_context_proof).
TINY = dict(
    d_model=64,
    num_heads=2,
    ffn_dim=128,
    num_encoder_layers=2,
    num_decoder_layers=2,
    dropout_rate=0.0,
    # 0: word-level pieces (synthetic.word_level_vocab_size). With byte fallback 256 pieces are
    # bytes; a smaller vocabulary splits words into letters and learning takes many more steps.
    vocab_size=0,
    batch_tokens=2048,
    num_steps=1500,
    warmup_steps=300,
    lr_scale=1.0,
    label_smoothing=0.0,
    # The schedule these settings were measured under, the papers' (post-LN, d_model-scaled
    # peak, no clipping, no EMA), not the configs' Bible recipe: under that one (1.5e-3 peak,
    # an EMA averaging ~1,000 steps) the tiny models of tests/test_context_proof.py stay near
    # chance in their few hundred steps (DocT 0.45, HM-GDC 0.36 forced choice).
    pre_ln=False,
    learning_rate=0.0,
    clip_norm=0.0,
    ema_decay=0.0,
)


# A dense variant a tiny document model learns in under 1,500 steps at learning-rate scale 0.5
# (Jean & Cho's Table 1 analogue, docs/log/2026-11-25-jean-cho.md): every document has a
# pronoun and a topic word, each with its antecedent one or two sentences back, 2-8 sentences.
# A model that sees the previous two sentences can resolve every labelled word; one without
# context stays at 1/3.
DENSE_TASK: dict[str, Any] = dict(
    p_pronoun=1.0, p_topic=1.0, distances=(1, 2), min_sentences=3, max_sentences=8
)


# The curriculum of ``--curriculum_steps``: short, dense variants of the task with the same
# lexicon (same seed and lexicon fields), both phenomena in every document. On "adjacent"
# (two sentences: the noun and the topic word in the first, the pronoun and the ambiguous word
# in the second) a tiny model learns both at once, since one attention pattern (to the special
# words of the other sentence) serves both; "short" spreads them over 1-3 sentences. Trained
# on the full task, or on dense variants with one phenomenon first, a tiny model learns one
# phenomenon and then stays at chance on the other (docs/log/2026-11-22-final.md, "Does FINAL
# use the context?").
CURRICULUM: tuple[tuple[str, dict[str, Any]], ...] = (
    ("adjacent", dict(distances=(1,), min_sentences=2, max_sentences=2)),
    ("short", dict(distances=(1, 2, 3), min_sentences=2, max_sentences=4)),
)
CURRICULUM_PHENOMENA = dict(p_pronoun=1.0, p_topic=1.0)


def warm_start(
    config: ml_collections.ConfigDict, workdir: str, stage_steps: list[int], seed: int = 0
) -> ml_collections.ConfigDict:
    """Trains ``config`` through the :data:`CURRICULUM` stages (``stage_steps[i]`` steps on
    stage ``i``, each starting from the previous one's parameters; 0 skips a stage), with a
    tokenizer trained on ``config``'s own (default) corpus, and returns ``config`` set to
    start from the last stage's parameters with that tokenizer."""
    if len(stage_steps) > len(CURRICULUM):
        raise ValueError(f"{len(stage_steps)} curriculum steps for {len(CURRICULUM)} stages")
    train_docs = data_setup.load_documents(config.data, "train")
    tokenizer = get_or_train_tokenizer(
        os.path.join(workdir, "spm.model"),
        train_docs,
        vocab_size=synthetic.word_level_vocab_size(train_docs),
    )
    init_from = config.get("init_from", "")
    for (name, task), steps in zip(CURRICULUM, stage_steps, strict=False):
        if not steps:
            continue
        stage_dir = os.path.join(workdir, f"curriculum_{name}")
        data_dir = os.path.join(stage_dir, "data")
        if not os.path.exists(os.path.join(data_dir, "test.labels.jsonl")):
            stage = synthetic.SyntheticConfig(
                num_documents=len(train_docs), seed=seed, **CURRICULUM_PHENOMENA, **task
            )
            synthetic.write_corpus(data_dir, stage, {"train": len(train_docs), "dev": 100})
        stage_config = ml_collections.ConfigDict(config.to_dict())
        stage_config.data.data_dir = data_dir
        stage_config.data.tokenizer = tokenizer.model_path
        stage_config.init_from = init_from
        stage_config.train.num_steps = stage_config.train.eval_every = steps
        stage_config.train.checkpoint_every = steps
        trainer.train_and_evaluate(
            stage_config,
            os.path.join(stage_dir, "model"),
            dev_hook=dev_eval.dev_bleu_hook(stage_config),
        )
        init_from = os.path.join(stage_dir, "model")
    config = ml_collections.ConfigDict(config.to_dict())
    config.data.tokenizer = tokenizer.model_path
    config.init_from = init_from
    return config


def make_corpus(
    data_dir: str,
    train: int = 2000,
    dev: int = 100,
    test: int = 500,
    seed: int = 0,
    task: dict[str, Any] | None = None,
) -> str:
    """Writes the synthetic corpus unless it is already there: the default generator settings,
    or those of ``task`` (:class:`~docnmt_jax.data.synthetic.SyntheticConfig` fields, e.g.
    :data:`DENSE_TASK`)."""
    if not os.path.exists(os.path.join(data_dir, "test.labels.jsonl")):
        config = synthetic.SyntheticConfig(num_documents=train, seed=seed, **(task or {}))
        synthetic.write_corpus(data_dir, config, {"train": train, "dev": dev, "test": test})
    return data_dir


def proof_config(
    config: ml_collections.ConfigDict, data_dir: str, **overrides: Any
) -> ml_collections.ConfigDict:
    """``config`` reading ``data_dir``, dev BLEU off, trained on the whole synthetic documents
    (never their multi-resolution cuts, which part a word from its antecedent), with the
    size/step ``overrides``: model keys (d_model, num_heads, ...) and vocab_size, batch_tokens,
    num_steps, warmup_steps, lr_scale, label_smoothing, seed, time_budget_minutes."""
    config = ml_collections.ConfigDict(config.to_dict())
    config.data.data_dir = data_dir
    config.data.corpus = "synthetic"
    config.data.train_as = "documents"
    config.train.dev_bleu = False
    config.train.best_metric = "dev_loss"
    config.train.best_mode = "min"
    config.train.log_every = 100
    for key, value in overrides.items():
        if value is None:
            continue
        if key in config.model:
            if key == "dropout_rate":
                config.model.attention_dropout_rate = 0.0
                config.model.relu_dropout_rate = 0.0
            config.model[key] = value
        elif key == "vocab_size":
            config.data.vocab_size = value or synthetic.word_level_vocab_size(
                data_setup.load_documents(config.data, "train")
            )
        elif key == "batch_tokens":
            config.data.batch_src_tokens = value
            config.data.batch_tgt_tokens = value
            config.data.eval_batch_tokens = 2 * value
        elif key == "num_steps":
            config.train.num_steps = value
            config.train.eval_every = overrides.get("eval_every") or value
            config.train.checkpoint_every = value
        elif key == "eval_every":
            config.train.eval_every = value
        elif key in config.train:
            config.train[key] = value
        else:
            raise ValueError(f"unknown override {key!r}")
    return config


def candidate_accuracy(
    hypotheses: dict[str, list[str]], labels: list[synthetic.ContextLabel]
) -> dict[str, Any]:
    """Accuracy over the labels whose hypothesis token is one of the label's candidate forms.

    Translation errors elsewhere in a sentence (a dropped or doubled word shifts the token
    index) make :func:`synthetic.context_accuracy` count a label as wrong whatever the model
    knows about the context; among the labels where the model did produce one of the forms,
    a context-blind model is right 1/C (1/T) of the time and a context-aware one always.
    """
    chosen = correct = 0
    by_distance: dict[int, list[int]] = {}
    for lb in labels:
        sents = hypotheses.get(lb.doc_id, [])
        tokens = sents[lb.segment].split() if lb.segment < len(sents) else []
        if lb.token_index < len(tokens) and tokens[lb.token_index] in lb.candidates:
            ok = int(tokens[lb.token_index] == lb.correct)
            chosen, correct = chosen + 1, correct + ok
            tally = by_distance.setdefault(lb.distance, [0, 0])
            tally[0], tally[1] = tally[0] + ok, tally[1] + 1
    return {
        "accuracy": correct / chosen if chosen else 0.0,
        "correct": correct,
        "total": chosen,
        "by_distance": {
            d: {"accuracy": c / n, "correct": c, "total": n}
            for d, (c, n) in sorted(by_distance.items())
        },
    }


def contrastive_hook(
    config: ml_collections.ConfigDict, workdir: str, split: str = "dev"
) -> dev_eval.EvalHook:
    """Eval hook: :func:`contrastive.contrastive_accuracy` on ``split`` (``ctx_acc`` overall,
    ``ctx_acc_dN`` per distance), so a run shows when the model starts to use the context."""
    data_dir = config.data.data_dir
    docs = data_setup.load_documents(config.data, split)
    labels = synthetic.read_labels(os.path.join(data_dir, f"{split}.labels.jsonl"))
    state: dict[str, Any] = {}

    def hook(params: Any, step: int) -> dict[str, float]:
        if not state:  # the tokenizer exists once training has started
            tokenizer = config.data.tokenizer or os.path.join(workdir, "spm.model")
            state["tokenizer"] = load_tokenizer(tokenizer)
            state["model"] = build_model(config.model, state["tokenizer"].vocab_size)
            state["scorer"] = contrastive.make_sentence_scorer(state["model"])
        result = contrastive.contrastive_accuracy(
            state["model"],
            params,
            state["tokenizer"],
            docs,
            labels,
            config.data.max_sentences,
            scorer=state["scorer"],
        )
        metrics = {"ctx_acc": result["accuracy"]}
        for ph, b in result["by_phenomenon"].items():
            metrics[f"ctx_acc_{ph}"] = b["accuracy"]
        metrics.update({f"ctx_acc_d{d}": b["accuracy"] for d, b in result["by_distance"].items()})
        return metrics

    return hook


def score(workdir: str, data_dir: str, batch_tokens: int = 4096) -> dict[str, Any]:
    """Greedy translation of ``data_dir``'s test split by the latest checkpoint of ``workdir``,
    scored by :func:`synthetic.context_accuracy` plus ``candidate`` (:func:`candidate_accuracy`)."""
    translator, _ = restore.load_translator(
        workdir, "latest", SearchConfig(beam_size=1, alpha=0.0), batch_tokens
    )
    docs = data_setup.load_documents(ml_collections.ConfigDict({"data_dir": data_dir}), "test")
    hyps = translator.translate(docs)
    labels = synthetic.read_labels(os.path.join(data_dir, "test.labels.jsonl"))
    hypotheses = {d.doc_id: h for d, h in zip(docs, hyps, strict=True)}
    scores = synthetic.context_accuracy(hypotheses, labels)
    scores["candidate"] = candidate_accuracy(hypotheses, labels)
    return scores


def run(
    config: ml_collections.ConfigDict,
    workdir: str,
    contrastive_split: str = "test",
    track: bool = False,
    forced_choice: bool = True,
) -> dict[str, Any]:
    """Trains ``config`` in ``workdir``, scores the greedy translation of the test split and
    (``forced_choice``) the forced choice (``contrastive``) on ``contrastive_split``;
    ``track`` logs the forced choice on the dev split at every evaluation
    (:func:`contrastive_hook`)."""
    start = time.monotonic()
    hooks = (contrastive_hook(config, workdir, "dev"),) if track else ()
    result = trainer.train_and_evaluate(
        config, workdir, eval_hooks=hooks, dev_hook=dev_eval.dev_bleu_hook(config)
    )
    train_s = time.monotonic() - start
    scores = score(workdir, config.data.data_dir, config.data.eval_batch_tokens)
    scores["train_seconds"] = train_s
    if not forced_choice:
        scores["total_seconds"] = time.monotonic() - start
        scores["dev"], scores["step"] = result.dev_metrics, result.step
        return scores
    model, _, _ = restore.load_model(workdir)
    params, _ = restore.load_params(model, workdir, "latest")
    docs = data_setup.load_documents(config.data, contrastive_split)
    labels = synthetic.read_labels(
        os.path.join(config.data.data_dir, f"{contrastive_split}.labels.jsonl")
    )
    scores["contrastive"] = contrastive.contrastive_accuracy(
        model,
        params,
        restore.load_run_tokenizer(config, workdir),
        docs,
        labels,
        config.data.max_sentences,
    )
    scores["total_seconds"] = time.monotonic() - start
    scores["dev"] = result.dev_metrics
    scores["step"] = result.step
    return scores


def markdown(scores: dict[str, Any], name: str = "model") -> str:
    """Overall, per-phenomenon and per-distance accuracy as markdown: the greedy translation
    (the labelled word of the output) and the teacher-forced forced choice."""
    forced = scores["contrastive"]
    lines = [
        f"**{name}** (step {scores.get('step', '?')}): translation accuracy "
        f"{scores['accuracy']:.4f} ({scores['correct']}/{scores['total']}, {scores['missing']} "
        f"missing), forced choice {forced['accuracy']:.4f} "
        f"({forced['correct']}/{forced['total']}), chance {scores['chance_level']:.4f}; "
        f"train {scores.get('train_seconds', 0):.0f} s, "
        f"total {scores.get('total_seconds', 0):.0f} s",
        "",
        "| distance | translation accuracy | correct/total | forced choice | correct/total |",
        "|---:|---:|---:|---:|---:|",
    ]
    empty = {"accuracy": 0.0, "correct": 0, "total": 0}
    rows = [(d, b, forced["by_distance"].get(d, empty)) for d, b in scores["by_distance"].items()]
    rows += [
        (ph, b, forced["by_phenomenon"].get(ph, empty)) for ph, b in scores["by_phenomenon"].items()
    ]
    for key, b, c in rows:
        lines.append(
            f"| {key} | {b['accuracy']:.4f} | {b['correct']}/{b['total']} | "
            f"{c['accuracy']:.4f} | {c['correct']}/{c['total']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = cli.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="config file, e.g. configs/final.py")
    p.add_argument("--workdir", required=True)
    p.add_argument("--data_dir", default="", help="synthetic corpus; default WORKDIR/data")
    p.add_argument("--train_docs", type=int, default=2000)
    p.add_argument("--test_docs", type=int, default=500)
    p.add_argument("--tiny", action="store_true", help="start from the TINY settings")
    p.add_argument("--json_out", default="", help="write the scores here as JSON")
    p.add_argument(
        "--track", action="store_true", help="log the dev forced choice at every evaluation"
    )
    p.add_argument(
        "--curriculum_steps",
        default="",
        help="comma-separated steps of the CURRICULUM stages ("
        + ", ".join(n for n, _ in CURRICULUM)
        + "), trained in order before the default task, e.g. 1500,1000,1000",
    )
    for key in (
        "d_model",
        "num_heads",
        "ffn_dim",
        "num_encoder_layers",
        "num_decoder_layers",
        "vocab_size",
        "batch_tokens",
        "num_steps",
        "eval_every",
        "warmup_steps",
        "seed",
    ):
        p.add_argument(f"--{key}", type=int, default=None)
    for key in ("dropout_rate", "lr_scale", "label_smoothing", "time_budget_minutes"):
        p.add_argument(f"--{key}", type=float, default=None)
    args = p.parse_args(argv)
    data_dir = make_corpus(
        args.data_dir or os.path.join(args.workdir, "data"), args.train_docs, test=args.test_docs
    )
    overrides = dict(TINY) if args.tiny else {}
    overrides.update(
        {
            k: v
            for k, v in vars(args).items()
            if v is not None
            and k
            not in (
                "config",
                "workdir",
                "data_dir",
                "train_docs",
                "test_docs",
                "tiny",
                "json_out",
                "curriculum_steps",
                "track",
            )
        }
    )
    config = proof_config(load_config(args.config), data_dir, **overrides)
    if args.curriculum_steps:
        try:
            stage_steps = [int(x) for x in args.curriculum_steps.split(",")]
        except ValueError:
            p.error(f"--curriculum_steps={args.curriculum_steps!r}: comma-separated integers")
        config = warm_start(config, args.workdir, stage_steps, config.train.seed)
    scores = run(config, os.path.join(args.workdir, "model"), track=args.track)
    print(markdown(scores, os.path.basename(args.config)))
    if args.json_out:
        write_atomic(args.json_out, json.dumps(scores, indent=2, default=str) + "\n")


if __name__ == "__main__":
    cli.run_argparse(main)
