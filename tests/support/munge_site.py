"""The seeded portal site (tests/support/portal.py) with a Unix user of this host as a
member of physics, for MUNGE authentication's tests: a credential names a uid, and the
portal acts as that uid's passwd entry, so the member must be a real user (`plain_user`)."""

from __future__ import annotations

import shutil
from pathlib import Path

from ledger import api
from ledger.store.db import make_engine, make_sessionmaker
from tests.support.munged import as_user, plain_user
from tests.support.portal import Site, seed_site

USER = plain_user()


def seed_munge_site(db_url: str) -> Site:
    site = seed_site(db_url)
    engine = make_engine(db_url)
    try:
        with make_sessionmaker(engine)() as s, s.begin():
            api.add_member(s, USER.pw_name, "physics", role="member")
    finally:
        engine.dispose()
    return site


def munge_wrapper(bin_dir: Path, socket: str) -> Path:
    """A `munge` in `bin_dir` that asks the munged at `socket`, as USER (--uid when the
    tests run as root): what the CLI finds first on PATH in the tests."""
    uid = as_user(USER)
    speak_as = f" --uid={uid} --gid={USER.pw_gid}" if uid is not None else ""
    bin_dir.mkdir(exist_ok=True)
    wrapper = bin_dir / "munge"
    wrapper.write_text(f'#!/bin/sh\nexec {shutil.which("munge")} --socket={socket}{speak_as} "$@"\n')
    wrapper.chmod(0o755)
    return bin_dir
