"""Decoding: batched beam search over an explicit decoder cache, and document translation.

``docnmt_jax.decoding.beam_search`` (the module) holds the model-agnostic search:
``beam_search``, ``greedy_search``, ``tile_beams``, ``gather_beams``, ``length_penalty``,
``source_length_limits``. Import from the submodule (``from docnmt_jax.decoding.beam_search
import beam_search``); this package does not re-export them so the module name stays unshadowed.
"""
