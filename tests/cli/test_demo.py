"""`make demo`: the plain printout (`--no-serve`, for scripts) and the portal it serves
on its own data, where the printed login works and Ctrl-C stops it cleanly."""

from __future__ import annotations

import http.cookiejar
import importlib.util
import re
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.support.served import Server, free_port
from tests.support.services import require


def _demo_env(tmp_path: Path) -> dict[str, str]:
    return {"GPUCREDIT_DATABASE_URL": f"sqlite:///{tmp_path / 'demo.db'}", "GPUCREDIT_CONFIG": "/dev/null"}


def test_no_serve_prints_the_site_and_exits(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpucredit.demo", "--no-serve"],
        env={**_demo_env(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "refused daily_cap" in done.stdout
    assert "audit verify: ok" in done.stdout
    assert "Portal:" not in done.stdout


def test_demo_serves_the_portal_with_the_printed_login(tmp_path: Path) -> None:
    require(importlib.util.find_spec("waitress") is not None, "waitress", "pip install -e '.[portal]'")
    port = free_port()
    server = Server([sys.executable, "-m", "gpucredit.demo", "--port", str(port)], _demo_env(tmp_path))
    server.start()
    try:
        printed = re.search(r"log in as alice \(PI of physics\) or admin, password (\S+)", server.output)
        assert printed, server.output
        assert f"Portal: http://127.0.0.1:{port}/" in server.output
        opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()), _NoRedirect()
        )
        base = f"http://127.0.0.1:{port}"
        with opener.open(f"{base}/login", timeout=30) as page:
            form = page.read().decode()
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', form)
        assert csrf, form
        body = urllib.parse.urlencode(
            {"username": "alice", "password": printed.group(1), "csrf_token": csrf.group(1)}
        ).encode()
        # A good login answers 302 to the portal; a bad one 401 with the form again.
        with pytest.raises(urllib.error.HTTPError) as answer:
            opener.open(f"{base}/login", data=body, timeout=30)
        with answer.value as redirect:
            assert redirect.code == 302, redirect.read()
            assert "/login" not in redirect.headers["Location"]
    finally:
        status = server.stop()
    assert status == 0, server.output
    assert "portal stopped" in server.output


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None
