"""Train a model: ``python launch/train.py --config configs/transformer.py --workdir runs/NAME``.

Every key of the config file can be overridden, e.g. ``--config.train.num_steps=2000``;
``--helpfull`` lists them. Starting again on a workdir that holds checkpoints resumes.
"""

from __future__ import annotations

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from docnmt_jax.training.trainer import train_and_evaluate  # noqa: E402

_DEFAULT_CONFIG = os.path.join(
    os.path.dirname(os.path.dirname(__file__)), "configs", "transformer.py"
)
_KEY_LINE = re.compile(r"^\s*config\.([\w.]+)\s*=\s*(.+?)\s*(?:#\s*(.*))?$")


def config_key_help(path: str = _DEFAULT_CONFIG) -> str:
    """One line per config key of ``path``: ``--config.KEY (default VALUE): comment``."""
    lines = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            match = _KEY_LINE.match(line)
            if match and "ConfigDict()" not in match.group(2):
                key, value, comment = match.groups()
                lines.append(
                    f"  --config.{key} (default {value}){': ' + comment if comment else ''}"
                )
    return "\n".join(lines)


_CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "Training configuration file (see configs/). Override any key with --config.KEY=VALUE; "
    "the keys of configs/transformer.py (other model configs add their own):\n" + config_key_help(),
    lock_config=True,
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, logs, tokenizer.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.WARNING)  # progress goes to the bar and WORKDIR/train.log
    result = train_and_evaluate(_CONFIG.value, _WORKDIR.value)
    dev = " ".join(f"{k}={v:.4f}" for k, v in sorted(result.dev_metrics.items()))
    print(f"step {result.step} ({result.stopped_by}): {dev}")


if __name__ == "__main__":
    app.run(main)
