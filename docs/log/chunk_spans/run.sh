#!/bin/bash
# Chunk spans: FINAL two-layout rows of 1024 (one span) vs 2048 (two spans) against the Transformer,
# Bible train plan, TED size, float32, 2,048-token batches; campaign stopped for the duration.
cd /work/main
PG=$(cat /work/campaign/campaign.pgid)
kill -STOP -- -$PG; sleep 2
for r in ${ROUNDS:-1 2}; do
  timeout 1500 .venv/bin/python launch/benchmark.py --size ted --sections peak,corpus \
    --tsv /work/main/data/bible/train.tsv --spm /work/bench/transformer/spm.model \
    --corpus-layouts packed --corpus-steps 40 --warmup 2 --corpus-test-tsv= \
    --models ${MODELS:-transformer,final:packed_layout=two_layout,final:packed_layout=two_layout+packed_chunk_spans=2} \
    --json /work/bench/spans/round_$r.json > /work/bench/spans/round_$r.log 2>&1
done
kill -CONT -- -$PG
