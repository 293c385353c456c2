"""Seeded corruptions of valid input files, for the fuzz tests.

Each operator turns a valid file's bytes into a corrupted variant the way real files go wrong:
a tab or a newline deleted or duplicated, invalid UTF-8, a BOM in the middle, CRLF line ends
mixed with LF, an empty side, a huge line, binary garbage, a file cut short, a NUL byte. The
operator and its position come from a seeded ``random.Random``, so a failure names a seed that
reproduces it.
"""

from __future__ import annotations

import random
from collections.abc import Callable

Corruption = Callable[[bytes, random.Random], bytes]


def _positions(data: bytes, byte: bytes) -> list[int]:
    return [i for i in range(len(data)) if data[i : i + 1] == byte]


def _edit_at(byte: bytes, replacement: Callable[[bytes], bytes]) -> Corruption:
    """Replaces one occurrence of ``byte`` (chosen at random) with ``replacement(byte)``."""

    def corrupt(data: bytes, rng: random.Random) -> bytes:
        where = _positions(data, byte)
        if not where:
            return data
        i = rng.choice(where)
        return data[:i] + replacement(byte) + data[i + 1 :]

    return corrupt


def _insert(piece: Callable[[random.Random], bytes]) -> Corruption:
    def corrupt(data: bytes, rng: random.Random) -> bytes:
        i = rng.randrange(len(data) + 1)
        return data[:i] + piece(rng) + data[i:]

    return corrupt


def _crlf_mix(data: bytes, rng: random.Random) -> bytes:
    lines = data.split(b"\n")
    return (
        b"".join(line + (b"\r\n" if rng.random() < 0.5 else b"\n") for line in lines[:-1])
        + lines[-1]
    )


def _empty_side(data: bytes, rng: random.Random) -> bytes:
    """Empties the text after one tab (a TSV's source or target), or one whole line."""
    lines = data.split(b"\n")
    k = rng.randrange(len(lines))
    parts = lines[k].split(b"\t")
    if len(parts) > 1:
        parts[rng.randrange(1, len(parts))] = b""
        lines[k] = b"\t".join(parts)
    else:
        lines[k] = b""
    return b"\n".join(lines)


def _huge_line(data: bytes, rng: random.Random) -> bytes:
    lines = data.split(b"\n")
    k = rng.randrange(len(lines))
    lines[k] = lines[k] + b" " + b"palabra " * rng.choice((2_000, 20_000))
    return b"\n".join(lines)


def _binary(data: bytes, rng: random.Random) -> bytes:
    size = rng.choice((0, 1, 17, 4096))
    return bytes(rng.randrange(256) for _ in range(size))


def _cut(data: bytes, rng: random.Random) -> bytes:
    return data[: rng.randrange(len(data) + 1)]


CORRUPTIONS: dict[str, Corruption] = {
    "delete_tab": _edit_at(b"\t", lambda b: b""),
    "duplicate_tab": _edit_at(b"\t", lambda b: b + b),
    "delete_newline": _edit_at(b"\n", lambda b: b""),
    "duplicate_newline": _edit_at(b"\n", lambda b: b + b),
    "invalid_utf8": _insert(lambda rng: rng.choice((b"\xff", b"\xc3", b"\xe2\x82", b"\x80\x80"))),
    "bom_in_middle": _insert(lambda rng: "\ufeff".encode()),
    "nul_byte": _insert(lambda rng: b"\x00"),
    "crlf_mix": _crlf_mix,
    "empty_side": _empty_side,
    "huge_line": _huge_line,
    "binary": _binary,
    "cut_short": _cut,
}


def corrupt(data: bytes, seed: int) -> tuple[str, bytes]:
    """``(operator name, corrupted bytes)`` for ``seed``: 1 to 3 operators in a row."""
    rng = random.Random(seed)
    names = [rng.choice(sorted(CORRUPTIONS)) for _ in range(rng.choice((1, 1, 2, 3)))]
    for name in names:
        data = CORRUPTIONS[name](data, rng)
    return "+".join(names), data
