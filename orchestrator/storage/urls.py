"""Database URLs: where a study's database is, and the only forms of a URL that may be shown.

A URL may carry a password (``user:password@`` or a query parameter); every message and log line
goes through ``redact`` or ``scrub``.
"""

from __future__ import annotations

import os
import shlex

import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

STORAGE_ENV = "HEADPRUNE_STORAGE"
# Query parameters that carry a credential (libpq, psycopg, PyMySQL, mysqlclient, SQLAlchemy).
SECRET_QUERY_KEYS = frozenset({"password", "passwd", "pwd", "sslpassword", "passfile", "token", "secret"})


def parse_url(url: str) -> sa.URL:
    """make_url, with a reason that never repeats the URL (it may hold a password)."""
    try:
        parsed = make_url(url)
    except ValueError:  # make_url's int() of the port
        raise ArgumentError("its port is not a number") from None
    except ArgumentError:
        raise ArgumentError("expected dialect+driver://user@host:port/database") from None
    if parsed.get_backend_name() != "sqlite" and url.split("?", 1)[0].count("@") > 1:
        # user:p@ss@host parses as password "p", host "ss@host" (u:p@ss/w@h as host "ss",
        # database "w@h"): the rest of the password would be shown in every message as the
        # host or the database, so such a URL is refused.
        raise ArgumentError("an '@' in the user name or password must be written %40")
    return parsed


def redact(url: str) -> str:
    """The URL with every credential replaced by ***, whether it is in ``user:password@`` or a
    query parameter (``?password=``): the only form that may be logged."""
    try:
        parsed = parse_url(url)
    except ArgumentError:
        return "<malformed database URL>"
    hidden = {k: "***" for k in parsed.query if k.lower() in SECRET_QUERY_KEYS}
    rendered = parsed.update_query_dict(hidden).render_as_string(hide_password=True)
    return rendered.replace("%2A%2A%2A", "***")


def _secrets(url: str) -> list[str]:
    """The credentials a URL holds: its password and its secret query parameters' values (none
    for a malformed URL, which is never shown: ``redact``)."""
    try:
        parsed = parse_url(url)
    except ArgumentError:
        return []
    found = [parsed.password] + [v for k, v in parsed.query.items() if k.lower() in SECRET_QUERY_KEYS]
    return [str(value) for item in found for value in (item if isinstance(item, tuple) else (item,)) if value]


def scrub(text: str, url: str) -> str:
    """``text`` (a driver's error message) with the URL's secrets in it replaced by ***."""
    for secret in _secrets(url):
        text = text.replace(secret, "***")
    return text


def redact_command(argv: list[str]) -> str:
    """A command line to show (the resume command after an interrupt), with the ``--storage``
    URL's credentials replaced by *** and a word on how to give them back."""
    shown, hidden = list(argv), False
    for i, arg in enumerate(argv):
        prefix = "--storage=" if arg.startswith("--storage=") else ""
        if not prefix and not (i > 0 and argv[i - 1] == "--storage"):
            continue
        url = arg.removeprefix(prefix)
        if _secrets(url):
            shown[i], hidden = prefix + redact(url), True
    note = (
        f" (put the password back in --storage, or leave --storage out and give the URL in ${STORAGE_ENV})"
        if hidden
        else ""
    )
    return shlex.join(shown) + note


def sqlite_database(url: str) -> str | None:
    """The file of an SQLite URL (None for other databases, in-memory ones and malformed URLs)."""
    try:
        parsed = parse_url(url)
    except ArgumentError:
        return None
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return parsed.database


def resolve_url(url: str | None, study_name: str) -> str:
    """--storage, else $HEADPRUNE_STORAGE, else an SQLite file runs/<study>.db."""
    return url or os.environ.get(STORAGE_ENV) or f"sqlite:///runs/{study_name}.db"
