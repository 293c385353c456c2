"""The prepared Bible corpus as a local TensorFlow Datasets builder, ``docnmt_bible``.

Importing this module registers the builder. It downloads nothing: it reads the
TSVs written by ``python launch/prepare_data.py --corpus bible --out DIR`` (see
:mod:`docnmt_jax.data.bible`; target text derived from the WEB) from ``DIR``, given
as tfds' manual directory::

    import tensorflow_datasets as tfds
    import docnmt_jax.data.tfds_bible  # registers 'docnmt_bible'

    ds = tfds.load(
        "docnmt_bible", split="train", data_dir="/tmp/tfds",
        download_and_prepare_kwargs={
            "download_config": tfds.download.DownloadConfig(manual_dir="data/bible")},
    )

or as ``builder_kwargs={"prepared_dir": "data/bible"}``. Splits: ``train``, ``dev``,
``test``. One example per *document* (chapter): ``doc_id`` (text), ``index`` (int32
position of the document in its split's TSV), ``src`` / ``tgt`` (sequences of verse
texts, aligned). The builder disables tfds' write shuffling so examples are stored
in document order, but readers should still restore the order by sorting on
``index`` (as :func:`load_documents` does), which holds whatever the read options.
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow_datasets as tfds
from etils import epath
from tensorflow_datasets.core import utils as tfds_utils

from docnmt_jax.data.bible import SPLITS
from docnmt_jax.data.documents import Document
from docnmt_jax.data.readers import read_tsv

NAME = "docnmt_bible"


class DocnmtBible(tfds.core.GeneratorBasedBuilder):
    """Spanish→English Bible documents (chapters of verses) from prepared TSVs."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Chapters as documents, split by whole books."}
    MANUAL_DOWNLOAD_INSTRUCTIONS = (
        "Run `python launch/prepare_data.py --corpus bible --out DIR` and pass DIR as "
        "tfds.download.DownloadConfig(manual_dir=DIR) (or builder_kwargs prepared_dir=DIR)."
    )

    # tfds 4.9.10 computes `code_path` via `importlib_resources`, which it only
    # declares as a dependency for Python < 3.9 (newer etils no longer pull it in);
    # this file's own path is what tfds' fallback would return anyway.
    @tfds_utils.classproperty
    @classmethod
    def code_path(cls) -> epath.Path:
        return epath.Path(__file__)

    def __init__(self, *, prepared_dir: str | os.PathLike | None = None, **kwargs):
        self._prepared_dir = os.fspath(prepared_dir) if prepared_dir is not None else None
        super().__init__(**kwargs)

    def _info(self) -> tfds.core.DatasetInfo:
        return self.dataset_info_from_configs(
            description=(
                "Bible es-en document corpus: source Reina-Valera 1909 (spaRV1909eb), "
                "target derived from the WEB (engWEB2015eb); document = chapter, "
                "segment = verse. Sort by `index` to restore document order."
            ),
            features=tfds.features.FeaturesDict(
                {
                    "doc_id": tfds.features.Text(),
                    "index": tfds.features.Scalar(dtype=np.int32),
                    "src": tfds.features.Sequence(tfds.features.Text()),
                    "tgt": tfds.features.Sequence(tfds.features.Text()),
                }
            ),
            disable_shuffling=True,
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        root = self._prepared_dir if self._prepared_dir is not None else dl_manager.manual_dir
        return {
            split: self._generate_examples(os.path.join(os.fspath(root), f"{split}.tsv"))
            for split in SPLITS
        }

    def _generate_examples(self, path: str):
        for index, doc in enumerate(read_tsv(path)):
            yield (
                index,
                {
                    "doc_id": doc.doc_id,
                    "index": index,
                    "src": list(doc.src),
                    "tgt": list(doc.tgt),
                },
            )


def load_documents(
    data_dir: str | os.PathLike, manual_dir: str | os.PathLike, split: str
) -> list[Document]:
    """Prepares (once) and loads one split of ``docnmt_bible``; documents in TSV order.

    ``data_dir``: where tfds stores the prepared dataset; ``manual_dir``: the directory
    with the TSVs from ``prepare_data.py``. The order is restored by sorting on ``index``.
    """
    builder = DocnmtBible(data_dir=os.fspath(data_dir))
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(manual_dir=os.fspath(manual_dir))
    )
    examples = tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False))
    rows = sorted(examples, key=lambda ex: int(ex["index"]))
    return [
        Document(
            doc_id=ex["doc_id"].decode("utf-8"),
            src=tuple(s.decode("utf-8") for s in ex["src"]),
            tgt=tuple(t.decode("utf-8") for t in ex["tgt"]),
        )
        for ex in rows
    ]
