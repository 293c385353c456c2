"""How ``tests/data/golden`` was made (run once, with the code of commit 05c332a, before the
model-interface refactor): tiny sentence-Transformer and FINAL runs trained 120
steps on a synthetic corpus, and their translations of ``input.tsv`` (greedy, and beam 2 with
alpha 1.0) by ``launch/translate.py --checkpoint latest``. ``tests/test_golden.py`` checks that
today's code restores those checkpoints and translates them to exactly the same text.

Re-running it with a later commit would only compare that commit with itself: keep the files.
"""

import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))  # tests/conftest.py
from conftest import tiny_config, tiny_final_config  # noqa: E402

from docnmt_jax.data import synthetic  # noqa: E402
from docnmt_jax.training import trainer  # noqa: E402

out = "/tmp/golden/out"
shutil.rmtree(out, ignore_errors=True)
os.makedirs(out)
data = os.path.join(out, "data")
synthetic.write_corpus(
    data,
    synthetic.SyntheticConfig(num_documents=60, seed=11),
    splits={"train": 60, "dev": 6, "test": 6},
)
for name, make in (("transformer", tiny_config), ("final", tiny_final_config)):
    cfg = make(data, num_steps=120)
    cfg.train.keep_checkpoints = 1
    cfg.model.d_model = 16
    cfg.model.ffn_dim = 32
    cfg.data.vocab_size = 300
    cfg.train.lr_scale = 2.0
    result = trainer.train_and_evaluate(cfg, os.path.join(out, name))
    print(name, result.step, result.dev_metrics)
# Then: input.tsv = the first two documents of data/test.tsv; for each run
#   launch/translate.py --workdir out/NAME --checkpoint latest --input input.tsv
#     --output NAME.greedy.tsv --beam 1 --alpha 0    (and NAME.beam2.tsv: --beam 2 --alpha 1.0)
# and best/, tensorboard/, train.log removed from each run directory.
