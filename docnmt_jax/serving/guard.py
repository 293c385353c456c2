"""Who may talk to the server: the Host allow-list, the Origin check and the bearer token.

* **Host** (DNS rebinding): a request's ``Host`` must name an allowed host, by default the
  bound address, ``localhost``, ``127.0.0.1`` and ``::1`` (``--allowed_hosts`` adds names;
  ``*`` allows any): else 403. A request without exactly one ``Host`` header is a 400.
* **Origin** (cross-site requests from a browser): a request with an ``Origin`` header must
  come from ``http(s)://ALLOWED_HOST[:port]`` (``Origin: null`` never does), and one whose
  ``Sec-Fetch-Site`` is ``cross-site`` or ``same-site`` is refused: else 403. Clients that are
  not browsers send neither header.
* **Token** (``--token_file``): every request needs ``Authorization: Bearer TOKEN``, else 401.

Binding an address that is not loopback without a token is refused unless ``--insecure``
(:func:`check_exposure`).
"""

from __future__ import annotations

import dataclasses
import hmac
import ipaddress
import re
from email.message import Message
from urllib.parse import urlsplit

from docnmt_jax.errors import UserError
from docnmt_jax.serving.documents import RequestError

_TOKEN = re.compile(r"[A-Za-z0-9._~+/=-]{16,4096}")


@dataclasses.dataclass(frozen=True)
class Access:
    """What a request must show: a ``Host`` in ``hosts`` (lower case; ``*``: any) and, when
    ``token`` is set, that bearer token."""

    hosts: frozenset[str]
    token: str = ""

    @classmethod
    def for_address(cls, bound: str, extra: str = "", token: str = "") -> Access:
        """The default hosts of a server bound to ``bound`` plus ``extra`` (comma-separated)."""
        hosts = {bound.strip("[]").lower(), "localhost", "127.0.0.1", "::1"}
        hosts |= {h.strip().strip("[]").lower() for h in extra.split(",") if h.strip()}
        return cls(frozenset(hosts - {""}), token)


def host_name(value: str) -> str:
    """The host of a ``Host`` header value (``name:port``, ``[v6]:port``), lower case."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def check(access: Access, headers: Message) -> None:
    """Raises a 400/403/401 :class:`RequestError` for a request ``access`` refuses."""
    hosts = headers.get_all("Host") or []
    if len(hosts) != 1:
        raise RequestError(400, f"{len(hosts)} Host headers; send exactly one")
    if "*" not in access.hosts and host_name(hosts[0]) not in access.hosts:
        raise RequestError(
            403, f"Host {hosts[0]!r} is not allowed here (--allowed_hosts adds host names)"
        )
    origin = headers.get("Origin")
    if origin is not None:
        parts = urlsplit(origin.strip())
        allowed = "*" in access.hosts or (parts.hostname or "") in access.hosts
        if parts.scheme not in ("http", "https") or not allowed:
            raise RequestError(403, f"cross-site request from Origin {origin!r} refused")
    if (headers.get("Sec-Fetch-Site") or "").strip().lower() in ("cross-site", "same-site"):
        raise RequestError(403, "cross-site request refused (Sec-Fetch-Site)")
    if access.token:
        scheme, _, given = (headers.get("Authorization") or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            given.strip().encode("utf-8", "replace"), access.token.encode()
        ):
            raise RequestError(401, "missing or wrong bearer token (Authorization: Bearer ...)")


def read_token(path: str) -> str:
    """The token in the file at ``path`` (surrounding whitespace dropped): 16 to 4096
    characters of ``A-Z a-z 0-9 . _ ~ + / = -``, else a one-line error."""
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"--token_file={path}: {getattr(e, 'strerror', None) or e}") from None
    if not _TOKEN.fullmatch(token):
        raise UserError(
            f"--token_file={path}: the token must be 16 to 4096 characters of "
            "A-Z a-z 0-9 . _ ~ + / = - (e.g. `openssl rand -hex 32`)"
        )
    return token


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` serves this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, token: str, insecure: bool) -> None:
    """Refuses to serve a non-loopback ``host`` without a token unless ``insecure``."""
    if not is_loopback(host) and not token and not insecure:
        raise UserError(
            f"--host={host} serves other machines: give --token_file (a bearer token), or "
            "--insecure to serve without one"
        )
