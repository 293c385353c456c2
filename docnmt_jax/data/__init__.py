"""Corpora, readers, tokenizer and the tf.data document pipeline."""
