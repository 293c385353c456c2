#!/bin/bash
# Jean & Cho (2019)'s Table 1 on the synthetic context task: a variant of
# the task whose pronoun antecedents and topic words are always in the previous sentence
# (distances=(1,), documents of 2-8 sentences, both phenomena in every document), so that
# Jean & Cho's model (k = 1) can resolve every labelled word from its context. Every row:
# the tiny proof size (d 64, 2 heads, ffn 128, 2+2 layers, word-level vocabulary, no dropout),
# STEPS (1,500) steps of 2,048-token batches, the same warm-up and learning rate. Rows as in
# experiments/recipes/table1_bible.sh: (a) transformer, (b) jean_cho_random, (c) jean_cho,
# (d) jean_cho_margin, and FINAL as (c) final / (d) final_margin; also (c)/(d) with the
# unbounded gate printed in Appendix A (jean_cho_linear, jean_cho_linear_margin) and FINAL
# trained by maximum likelihood on the [B, S, T] grid that the margin objective trains on
# (final_grid: the same real target tokens a step as final_margin) and final_margin without
# gradients through the random-context scores (final_margin_stopgrad); not run by default. Each run is then measured
# with launch/evaluate.py --workdir (true context and DRAWS = 3 random contexts, beam 5)
# into OUT/ROW/context/ and scored for the labelled words (launch/context_proof.py's scorer).
#
#   bash experiments/recipes/table1_synthetic.sh [OUT_DIR] [ROW ...]
#        (env: STEPS=1500 LR_SCALE=1.0 SEED=0 DRAWS=3 PYTHON=python; SEED is the training seed,
#        the data are always generated with seed 0)
set -euo pipefail
OUT=${1:-runs/table1_synthetic}
shift $(($# < 1 ? $# : 1))
ROWS=("$@")
[ ${#ROWS[@]} -eq 0 ] && ROWS=(transformer jean_cho_random jean_cho jean_cho_margin final final_margin)
STEPS=${STEPS:-1500}
LR_SCALE=${LR_SCALE:-1.0}
SEED=${SEED:-0}
DRAWS=${DRAWS:-3}
PY=${PYTHON:-python}
DATA="$OUT/data"
mkdir -p "$OUT"
if [ ! -s "$DATA/test.labels.jsonl" ]; then
  $PY - "$DATA" <<'PYEOF'
import sys

from docnmt_jax.data import synthetic

config = synthetic.SyntheticConfig(
    num_documents=2000, distances=(1,), min_sentences=2, max_sentences=8,
    p_pronoun=1.0, p_topic=1.0, seed=0,
)
synthetic.write_corpus(sys.argv[1], config, {"train": 2000, "dev": 100, "test": 500})
PYEOF
fi
VOCAB=$($PY -c "import sys; from docnmt_jax.data import readers, synthetic; \
print(synthetic.word_level_vocab_size(readers.read_tsv(sys.argv[1])))" "$DATA/train.tsv")
tiny=(--config.data.data_dir="$DATA" --config.data.corpus=synthetic --config.data.vocab_size="$VOCAB"
  --config.data.batch_src_tokens=2048 --config.data.batch_tgt_tokens=2048
  --config.data.eval_batch_tokens=4096 --config.model.d_model=64 --config.model.num_heads=2
  --config.model.ffn_dim=128 --config.model.num_encoder_layers=2 --config.model.num_decoder_layers=2
  --config.model.dropout_rate=0.0 --config.model.attention_dropout_rate=0.0
  --config.model.relu_dropout_rate=0.0 --config.train.label_smoothing=0.0
  --config.train.warmup_steps=300 --config.train.lr_scale="$LR_SCALE" --config.train.num_steps="$STEPS"
  --config.train.eval_every="$STEPS" --config.train.checkpoint_every="$STEPS"
  --config.train.dev_bleu=False --config.train.best_metric=dev_loss --config.train.best_mode=min
  --config.train.seed="$SEED")

for row in "${ROWS[@]}"; do
  case $row in
    transformer) args=(--config configs/transformer.py) ;;
    jean_cho_random) args=(--config configs/jean_cho.py --config.objective.name=random_context
      --config.data.packed=False) ;;
    jean_cho) args=(--config configs/jean_cho.py) ;;
    jean_cho_margin) args=(--config configs/jean_cho.py --config.objective.name=context_margin
      --config.data.packed=False) ;;
    jean_cho_linear) args=(--config configs/jean_cho.py --config.model.gate=linear) ;;
    jean_cho_linear_margin) args=(--config configs/jean_cho.py --config.model.gate=linear
      --config.objective.name=context_margin --config.data.packed=False) ;;
    final) args=(--config configs/final.py) ;;
    final_margin) args=(--config configs/final.py --config.objective.name=context_margin
      --config.data.packed=False) ;;
    final_grid) args=(--config configs/final.py --config.data.packed=False) ;;
    final_margin_stopgrad) args=(--config configs/final.py --config.objective.name=context_margin
      --config.objective.context_margin.random_context_gradient=False --config.data.packed=False) ;;
    *) echo "unknown row $row" >&2; exit 2 ;;
  esac
  if [ ! -d "$OUT/$row/checkpoints/$STEPS" ]; then
    $PY launch/train.py "${args[@]}" --workdir "$OUT/$row" "${tiny[@]}"
  fi
  PYTHON="$PY" DRAWS="$DRAWS" bash "$(dirname "$0")/context_rows.sh" "$OUT" "$DATA/test.tsv" "$row"
done
