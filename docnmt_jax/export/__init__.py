"""Exporting a trained run: a parameters-only release directory and the StableHLO of its search.

* :mod:`docnmt_jax.export.release`: the release's files and manifest (numpy only), written by
  ``launch/export.py`` and read by :mod:`docnmt_jax.training.restore` wherever it takes a
  workdir.
* :mod:`docnmt_jax.export.stablehlo`: ``jax.export`` of the sentence Transformer's encoder and
  decoder step (``launch/export.py --stablehlo``).
* :mod:`docnmt_jax.export.greedy`: a standalone greedy translator over those artifacts that
  imports only numpy, jax and sentencepiece.

Nothing is imported here, so the reader stays free of flax and the models (docs/export.md).
"""
