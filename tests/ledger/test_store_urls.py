"""The ledger's database URL may name an HA cluster: several hosts, of which psycopg keeps
the one that takes writes (`target_session_attrs=read-write`; docs/failover.md). Both
ways of writing one reach psycopg as libpq's host and port lists; nothing connects here
(tests/ha connects to a real cluster)."""

from __future__ import annotations

import pytest

from ledger.store.db import make_engine, sqlalchemy_url

SQLALCHEMY_FORM = "postgresql://u@/ledger?host=db1:5433&host=db2:5434&target_session_attrs=read-write"
LIBPQ_FORM = "postgresql://u@db1:5433,db2:5434/ledger?target_session_attrs=read-write"


@pytest.mark.parametrize("url", [SQLALCHEMY_FORM, LIBPQ_FORM, LIBPQ_FORM.replace("://", "+psycopg://")])
def test_a_multi_host_url_reaches_psycopg_as_host_and_port_lists(url: str) -> None:
    engine = make_engine(url)
    _args, connect = engine.dialect.create_connect_args(engine.url)
    assert engine.dialect.driver == "psycopg"
    assert (connect["host"], connect["port"], connect["dbname"], connect["user"]) == (
        "db1,db2",
        "5433,5434",
        "ledger",
        "u",
    )
    assert connect["target_session_attrs"] == "read-write"
    engine.dispose()


def test_libpqs_form_is_rewritten_and_every_other_url_left_alone() -> None:
    assert sqlalchemy_url(LIBPQ_FORM) == SQLALCHEMY_FORM
    assert sqlalchemy_url("postgresql://u:pw@a,b/x") == "postgresql://u:pw@/x?host=a&host=b"
    for url in (
        SQLALCHEMY_FORM,
        "postgresql://u@h:5432/db",
        "sqlite:////var/lib/gpucredit/ledger.db",
        "sqlite://",
    ):
        assert sqlalchemy_url(url) == url
