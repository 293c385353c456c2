"""Decoding: batched beam search over an explicit decoder cache, the search drivers every
model uses, and document translation.

``beam_search`` (the module) holds the model-agnostic search (``beam_search``,
``greedy_search``, ``tile_beams``, ``gather_beams``, ``length_penalty``); ``search`` the
settings, output limits and drivers (per row, slot by slot, compiled); ``translator`` the
Translator. Import from the submodules; this package re-exports nothing.
"""
