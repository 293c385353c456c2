"""Reading the verses of installed SWORD zText Bible modules (:func:`read_module_verses`).

pysword's public ``get()`` decompresses a whole book for every verse; here each module's ztext
index files (``.bzs`` block index, ``.bzv`` verse index, ``.bzz`` compressed blocks) are read
once and every block is decompressed once, using pysword only for the conf files and the
versification tables. Verse text is cleaned with :func:`docnmt_jax.data.osis.clean_osis`.
"""

from __future__ import annotations

import bz2
import lzma
import os
import struct
import zlib

from docnmt_jax.data.osis import clean_osis
from docnmt_jax.errors import UserError

APT_PACKAGES = "sword-text-sparv sword-text-web"
INSTALL_HINT = (
    f"run `apt-get install -y {APT_PACKAGES}` (as root, or with sudo), or point "
    "--sword_path / $SWORD_PATH at a SWORD data directory that holds them"
)
DEFAULT_SWORD_PATHS = ("/usr/share/sword", os.path.join("~", ".sword"))

VerseKey = tuple[str, int, int]  # (OSIS book, chapter, verse)


class SwordModuleNotFoundError(UserError, FileNotFoundError):
    """A SWORD module is not installed in any searched directory."""


def sword_search_paths(sword_path: str | os.PathLike | None = None) -> list[str]:
    """Directories searched for SWORD modules, in order of precedence.

    ``sword_path`` if given, else ``$SWORD_PATH`` (``os.pathsep``-separated) if set,
    else ``/usr/share/sword`` and ``~/.sword``.
    """
    if sword_path:
        paths = [os.fspath(sword_path)]
    elif os.environ.get("SWORD_PATH"):
        paths = [p for p in os.environ["SWORD_PATH"].split(os.pathsep) if p]
    else:
        paths = list(DEFAULT_SWORD_PATHS)
    return [os.path.expanduser(p) for p in paths]


def find_module(module_name: str, sword_path: str | os.PathLike | None = None) -> tuple[dict, str]:
    """(parsed conf, module data directory) of the first search path holding the module."""
    from pysword.modules import SwordModules

    searched = sword_search_paths(sword_path)
    for path in searched:
        if not os.path.isdir(os.path.join(path, "mods.d")):
            continue
        modules = SwordModules(path).parse_modules()
        if module_name in modules:
            conf = modules[module_name]
            return conf, os.path.normpath(os.path.join(path, conf["datapath"]))
    raise SwordModuleNotFoundError(
        f"SWORD module {module_name!r} not found in {', '.join(searched)}: {INSTALL_HINT}"
    )


_DECOMPRESS = {"ZIP": zlib.decompress, "BZIP2": bz2.decompress, "XZ": lzma.decompress}
_RECORD_FORMATS = {"ztext": "<IIH", "ztext4": "<III"}


def read_module_verses(
    module_name: str, sword_path: str | os.PathLike | None = None, *, raw: bool = False
) -> dict[VerseKey, str]:
    """All verses of a compressed (zText) SWORD Bible module, keyed by (book, chapter, verse).

    Every key of the module's versification is present (empty string where the
    module has no text). Text is cleaned with :func:`clean_osis` unless ``raw``.
    Each compressed block is read and decompressed once (about 0.1 s a module, plus
    about 0.4 s of cleaning), instead of once per verse as pysword's ``get()`` does.

    Raises:
      SwordModuleNotFoundError: the module is in none of :func:`sword_search_paths`.
    """
    from pysword.books import BibleStructure

    conf, data_dir = find_module(module_name, sword_path)
    driver = conf.get("moddrv", "").lower()
    if driver not in _RECORD_FORMATS:
        raise ValueError(f"{module_name}: module driver {driver!r} is not supported")
    compress = conf.get("compresstype", "ZIP").upper()
    if compress not in _DECOMPRESS or conf.get("cipherkey"):
        raise ValueError(f"{module_name}: compression {compress!r} or cipher unsupported")
    letter = {"BOOK": "b", "CHAPTER": "c", "VERSE": "v"}[conf.get("blocktype", "BOOK").upper()]
    encoding = "utf-8" if conf.get("encoding", "").upper() == "UTF-8" else "cp1252"
    record = struct.Struct(_RECORD_FORMATS[driver])
    present = [t for t in ("ot", "nt") if os.path.exists(os.path.join(data_dir, f"{t}.{letter}zv"))]
    structure = BibleStructure(conf.get("versification", "kjv").lower(), present)

    verses: dict[VerseKey, str] = {}
    for testament, books in structure.get_books().items():
        base = os.path.join(data_dir, f"{testament}.{letter}z")
        with open(base + "v", "rb") as f:
            verse_index = f.read()
        with open(base + "s", "rb") as f:
            block_index = f.read()
        with open(base + "z", "rb") as f:
            blocks = f.read()
        cache: dict[int, bytes] = {}

        def block(num: int, block_index=block_index, blocks=blocks, cache=cache) -> bytes:
            if num not in cache:
                if (num + 1) * 12 > len(block_index):
                    cache[num] = b""
                else:
                    offset, size, _ = struct.unpack_from("<III", block_index, num * 12)
                    cache[num] = _DECOMPRESS[compress](blocks[offset : offset + size])
            return cache[num]

        # Index layout (as in pysword): 2 testament entries, then per book one book
        # heading entry and per chapter one heading entry followed by its verses.
        book_offset = 2
        for book in books:
            for chapter in range(1, book.num_chapters + 1):
                indices = book.get_indicies(chapters=[chapter], offset=book_offset)
                for verse, index in enumerate(indices, start=1):
                    text = ""
                    if (index + 1) * record.size <= len(verse_index):
                        num, start, length = record.unpack_from(verse_index, index * record.size)
                        if length:
                            data = block(num)[start : start + length]
                            text = data.decode(encoding, errors="replace")
                    verses[(book.osis_name, chapter, verse)] = text if raw else clean_osis(text)
            book_offset += book.size
    return verses
