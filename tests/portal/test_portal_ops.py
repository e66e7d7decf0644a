"""Operations: the Open OnDemand balance document and file, /metrics, /healthz, the
Grafana dashboard's metric names, and `gpucredit balance` for one's own accounts.

Figures are the seeded site's (tests/support/portal.py): physics 100.00 available and
14.40 held (job 1003 runs), 5.60 spent; chemistry 39.00 available, 1.00 spent.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from flask import Flask
from flask.testing import FlaskClient
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.orm import Session
from werkzeug.test import Client

from gpucredit.cli import _build
from gpucredit.daemon.metrics import DEFAULT_PORT, DaemonMetrics
from gpucredit.daemon.server import Daemon
from ledger import api, cli_support
from ledger.config import load_config
from ledger.jobs import jobruns
from ledger.store.db import make_engine, make_sessionmaker
from ledger.timeutil import utcnow
from portal import ood
from portal.ood import ood_document
from portal.ops import metrics_app
from portal.settings import PortalConfigError
from tests.support import REPO
from tests.support.daemon import NO_VAL, PARTITIONS, sinfo_runner
from tests.support.fakedaemon import sockdir as sockdir
from tests.support.portal import Site, bearer, make_app, seed_site

DASHBOARD = REPO / "gpucredit" / "examples" / "grafana" / "gpucredit.json"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@contextmanager
def ledger_tx(db_url: str) -> Iterator[Session]:
    engine = make_engine(db_url)
    try:
        with make_sessionmaker(engine)() as s, s.begin():
            yield s
    finally:
        engine.dispose()


def read_ood(db_url: str, **kwargs: Any) -> dict[str, Any]:
    with ledger_tx(db_url) as s:
        return ood_document(s, **kwargs)


def samples(exposition: str) -> Samples:
    """Every sample of a Prometheus text exposition: (name, labels) -> value."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
    }


def metrics_client(app: Any) -> Client:
    """A client of the portal's metrics listener (portal.ops.metrics_app), not its port."""
    return Client(metrics_app(app))


def scrape(client: FlaskClient) -> Samples:
    response = metrics_client(client.application).get("/metrics", environ_base={"REMOTE_ADDR": "127.0.0.1"})
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.content_type.startswith("text/plain; version=")
    return samples(response.get_data(as_text=True))


def value(found: Samples, name: str, **labels: str) -> float | None:
    return found.get((name, frozenset(labels.items())))


@pytest.fixture
def gc(portal_db: str, site: Site) -> Iterator[Callable[..., Result]]:
    """`gpucredit ARGS` on the seeded site as `user` (its $USER); asserts the exit status."""
    root = _build()

    def run(*args: str, user: str = "alice", code: int = 0) -> Result:
        env = {"GPUCREDIT_DATABASE_URL": portal_db, "USER": user}
        result = CliRunner().invoke(root, list(args), env=env)  # type: ignore[arg-type]
        assert result.exit_code == code, (args, result.output, result.stderr)
        return result

    yield run
    engine = cli_support._engines.pop(portal_db, None)
    if engine is not None:
        engine.dispose()


# --- Open OnDemand -----------------------------------------------------------------------


def test_ood_document_lists_each_member_with_whole_credits_rounded_down(portal_db: str, site: Site) -> None:
    # After the site's grants began (a fixed date here became a date bomb once it passed).
    now = utcnow().replace(microsecond=0)
    assert read_ood(portal_db, now=now) == {
        "version": 1,
        "timestamp": int(now.timestamp()),
        "config": {"unit": "credits", "project_type": "account"},
        "balances": [
            {"user": "alice", "project": "physics", "value": 100},
            {"user": "bob", "project": "physics", "value": 100},
            {"user": "carol", "project": "chemistry", "value": 39},
        ],
    }


def test_ood_document_for_one_user_and_for_none(portal_db: str, site: Site) -> None:
    assert read_ood(portal_db, user="carol")["balances"] == [
        {"user": "carol", "project": "chemistry", "value": 39}
    ]
    assert read_ood(portal_db, user="dave")["balances"] == []


def test_ood_value_is_rounded_down_not_to_nearest(portal_db: str, site: Site) -> None:
    with ledger_tx(portal_db) as s:
        api.consume(s, "chemistry", "0.01")
    assert read_ood(portal_db, user="carol")["balances"] == [
        {"user": "carol", "project": "chemistry", "value": 38}
    ]


def test_export_ood_balance_replaces_the_file_whole(
    gc: Callable[..., Result], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "ood" / "balance.json"
    target.parent.mkdir()
    target.write_text("old")
    seen: list[tuple[str, int, object, str]] = []
    real_replace = os.replace

    def replace(source: str, destination: str) -> None:
        # At the rename the old file is still whole and the new one is complete beside it.
        seen.append(
            (
                target.read_text(),
                stat.S_IMODE(os.stat(source).st_mode),
                json.loads(Path(source).read_text()),
                str(Path(source).parent),
            )
        )
        real_replace(source, destination)

    monkeypatch.setattr(ood.os, "replace", replace)
    result = gc("export", "ood-balance", str(target))
    written = json.loads(target.read_text())
    assert [b["value"] for b in written["balances"]] == [100, 100, 39]
    assert seen == [("old", 0o644, written, str(target.parent))]
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert sorted(p.name for p in target.parent.iterdir()) == ["balance.json"]
    assert "3 balances" in result.stderr


def test_export_that_fails_midway_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "balance.json"
    target.write_text("old")

    def broken_dump(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(ood.json, "dump", broken_dump)
    with pytest.raises(OSError, match="disk full"):
        ood.write_atomically(target, {"version": 1})
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["balance.json"]


# --- gpucredit balance without an account ---------------------------------------------


def test_balance_without_account_lists_the_callers_accounts(gc: Callable[..., Result]) -> None:
    assert json.loads(gc("balance", "--format", "json", user="alice").stdout) == [
        {"account": "physics", "available": "100.00", "held": "14.40"}
    ]
    assert gc("balance", "--format", "csv", user="carol").stdout == (
        "account,available,held\nchemistry,39.00,0.00\n"
    )
    table = gc("balance", user="bob").stdout.splitlines()
    assert table[0].split() == ["ACCOUNT", "AVAILABLE", "HELD"]
    assert table[1].split() == ["physics", "100.00", "14.40"]


def test_balance_without_account_for_a_user_in_none(gc: Callable[..., Result]) -> None:
    result = gc("balance", user="dave", code=1)
    assert result.stdout == ""
    assert "error: no_account: dave is a member of no account" in result.stderr


def test_balance_with_an_account_is_unchanged(gc: Callable[..., Result]) -> None:
    shown = json.loads(gc("balance", "physics", "--format", "json", user="dave").stdout)
    assert (shown["account"], shown["available"], shown["held"]) == ("physics", "100.00", "14.40")


# --- /metrics ----------------------------------------------------------------------------


def test_metrics_show_the_seeded_ledger(client: FlaskClient) -> None:
    found = scrape(client)
    expected = {
        ("gpucredit_ledger_up", ()): 1.0,
        ("gpucredit_credits_available", (("account", "physics"),)): 100.0,
        ("gpucredit_credits_held", (("account", "physics"),)): 14.4,
        ("gpucredit_credits_spent_total", (("account", "physics"),)): 5.6,
        ("gpucredit_credits_returned_total", (("account", "physics"),)): 0.0,
        ("gpucredit_active_holds", (("account", "physics"),)): 1.0,
        ("gpucredit_credits_available", (("account", "chemistry"),)): 39.0,
        ("gpucredit_credits_held", (("account", "chemistry"),)): 0.0,
        ("gpucredit_credits_spent_total", (("account", "chemistry"),)): 1.0,
        ("gpucredit_active_holds", (("account", "chemistry"),)): 0.0,
        # bob's 1 h on one a100 (2.00) and carol's 15 min on two (1.00); alice's 30 min on two h100
        ("gpucredit_charged_credits_total", (("gres", "a100"), ("partition", "none"))): 3.0,
        ("gpucredit_charged_credits_total", (("gres", "h100"), ("partition", "none"))): 3.6,
        ("gpucredit_charged_gpu_seconds_total", (("gres", "a100"), ("partition", "none"))): 5400.0,
        ("gpucredit_charged_gpu_seconds_total", (("gres", "h100"), ("partition", "none"))): 3600.0,
        ("gpucredit_ledger_errors_total", ()): 0.0,
    }
    assert {key: found.get((key[0], frozenset(key[1]))) for key in expected} == expected
    names = {name for name, _labels in found}
    assert not names & {"gpucredit_sacct_lag_seconds", "gpucredit_meter_lag_seconds"}  # never ran


def test_counters_only_grow_and_lags_appear_once_there_is_something_to_lag(
    portal_db: str, site: Site, client: FlaskClient
) -> None:
    with ledger_tx(portal_db) as s:
        hold = api.find_active_hold(s, "default", 1003, None)
        assert hold is not None
        jobruns.write_cursor(s, "sacct", site.now - timedelta(seconds=90), at=site.now)
        jobruns.write_cursor(s, "meter", site.now - timedelta(seconds=30), at=site.now)  # the last tick
        api.hold_usage(s, hold.id, 1800, at=site.now - timedelta(seconds=30))  # 1800 s on one h100: 1.80
    found = scrape(client)
    assert value(found, "gpucredit_credits_spent_total", account="physics") == 7.4
    assert value(found, "gpucredit_charged_gpu_seconds_total", gres="h100", partition="none") == 5400.0
    assert 90 <= (value(found, "gpucredit_sacct_lag_seconds") or 0) < 3600
    assert 30 <= (value(found, "gpucredit_meter_lag_seconds") or 0) < 3600
    with ledger_tx(portal_db) as s:
        api.settle_hold(s, hold.id, 1700, at=site.now)  # ran less than provisionally charged: 0.10 back
    found = scrape(client)
    assert value(found, "gpucredit_credits_spent_total", account="physics") == 7.4
    assert value(found, "gpucredit_credits_returned_total", account="physics") == 0.1
    assert value(found, "gpucredit_credits_held", account="physics") == 0.0
    assert value(found, "gpucredit_charged_gpu_seconds_total", gres="h100", partition="none") == 5400.0
    assert 30 <= (value(found, "gpucredit_meter_lag_seconds") or 0) < 3600  # a heartbeat, not charges


def test_metrics_count_the_portals_requests(client: FlaskClient) -> None:
    client.get("/healthz")
    client.get("/healthz")
    client.get("/no/such/page")
    found = scrape(client)
    assert value(found, "gpucredit_http_requests_total", endpoint="ops.healthz", status="200") == 2.0
    assert value(found, "gpucredit_http_requests_total", endpoint="none", status="404") == 1.0
    assert value(found, "gpucredit_http_request_duration_seconds_count", endpoint="ops.healthz") == 2.0


def test_metrics_are_not_on_the_portals_port_at_all(client: FlaskClient) -> None:
    """Whatever reaches the portal's port may have come through the public proxy, from
    loopback: /metrics is only on the metrics listener."""
    for environ in ({}, {"REMOTE_ADDR": "::1"}, {"REMOTE_ADDR": "10.1.2.3"}):
        assert client.get("/metrics", environ_base=environ).status_code == 404


def test_the_metrics_listener_answers_only_allowed_peers(client: FlaskClient) -> None:
    metrics = metrics_client(client.application)
    assert metrics.get("/metrics", environ_base={"REMOTE_ADDR": "10.1.2.3"}).status_code == 404
    assert metrics.get("/metrics", environ_base={"REMOTE_ADDR": "::1"}).status_code == 200
    assert metrics.get("/metrics", environ_base={"REMOTE_ADDR": "::ffff:127.0.0.1"}).status_code == 200
    assert metrics.get("/", environ_base={"REMOTE_ADDR": "127.0.0.1"}).status_code == 404
    assert metrics.post("/metrics", environ_base={"REMOTE_ADDR": "127.0.0.1"}).status_code == 405


def test_metrics_allow_is_configurable(portal_db: str, site: Site) -> None:
    metrics = metrics_client(make_app(portal_db, portal={"metrics_allow": ["10.0.0.0/8"]}))
    assert metrics.get("/metrics", environ_base={"REMOTE_ADDR": "10.1.2.3"}).status_code == 200
    assert metrics.get("/metrics", environ_base={"REMOTE_ADDR": "127.0.0.1"}).status_code == 404
    with pytest.raises(PortalConfigError, match=r"portal\.metrics_allow"):
        make_app(portal_db, portal={"metrics_allow": ["not-a-network"]})


# --- /healthz ----------------------------------------------------------------------------


def shipped_revision() -> str:
    from alembic.script import ScriptDirectory

    from ledger.store.schema import alembic_config

    return str(ScriptDirectory.from_config(alembic_config()).get_current_head())


def test_healthz_reports_the_database_and_its_revision(client: FlaskClient) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.get_json() == {"status": "ok", "database": "ok", "revision": shipped_revision()}


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])  # closed again when the block ends


@pytest.fixture
def unreachable() -> Flask:
    """A portal whose PostgreSQL does not listen."""
    return make_app(f"postgresql+psycopg://gpucredit@127.0.0.1:{closed_port()}/gpucredit")


def test_healthz_is_503_when_the_database_does_not_answer(unreachable: Flask) -> None:
    client = unreachable.test_client()
    response = client.get("/healthz")
    assert response.status_code == 503
    body = response.get_json()
    assert (body["status"], body["database"], body["error"]["code"]) == ("error", "error", "unavailable")


def test_a_request_that_meets_a_dead_database_is_503_and_counted(unreachable: Flask) -> None:
    client = unreachable.test_client()
    response = client.get("/healthz", headers=bearer("gpc_whatever"))  # the token lookup fails
    assert response.status_code == 503
    assert response.get_json()["error"]["code"] == "unavailable"
    found = scrape(client)
    assert value(found, "gpucredit_ledger_up") == 0.0
    assert value(found, "gpucredit_credits_available", account="physics") is None
    assert value(found, "gpucredit_ledger_errors_total") == 2.0  # the request and this scrape


def test_healthz_is_503_on_a_database_without_schema(tmp_path: Path) -> None:
    response = make_app(f"sqlite:///{tmp_path / 'empty.db'}").test_client().get("/healthz")
    assert response.status_code == 503
    assert response.get_json()["error"]["code"] == "not_initialised"


# --- the daemon's metrics ------------------------------------------------------------------


def free_port() -> int:
    return closed_port()


def daemon_on(db_url: str, port: int = DEFAULT_PORT) -> Daemon:
    """A daemon on `db_url`, its metrics on `port` (counted; served only by serve())."""
    config = load_config(Path("/dev/null"))
    config["database"]["url"] = db_url
    config["daemon"]["metrics_port"] = port
    return Daemon(config, sinfo_runner())


def daemon_requests(daemon: Daemon) -> None:
    """A ping, a hold chemistry cannot pay (8 h100 for 10 h: 288.00 > 39.00), an unknown
    operation and a submission job_submit refuses (an account the ledger does not know)."""
    daemon.snapshots.refresh()
    assert daemon.handle({"op": "ping"})["ok"]
    hold = {"account": "chemistry", "user": "carol", "job_id": 3001, "cluster": "default"}
    refused = daemon.handle({"op": "hold", **hold, "gpus": {"h100": 8}, "seconds": 36_000})
    assert refused["error"]["code"] == "insufficient_credits"
    assert daemon.handle({"op": "format_disk"})["error"]["code"] == "unknown_op"
    # The submission as job_submit.lua sends it: one compact line, "op" first (its own path)
    line = json.dumps(
        {
            "op": "submit",
            "user_name": "carol",
            "user_id": 1003,
            "account": "nosuch",
            "partitions": PARTITIONS,
            "time_limit": 60,
            "num_tasks": NO_VAL,
            "min_nodes": NO_VAL,
            "tres_per_node": "gres:gpu:a100:1",
        },
        separators=(",", ":"),
    ).encode()
    answers = _Answers()
    daemon.dispatch(line, answers)  # type: ignore[arg-type]  # a Reply is what has send()
    assert json.loads(answers[0])["result"]["decision"] == "reject"


class _Answers(list[bytes]):
    def send(self, line: bytes) -> None:
        self.append(line)


def test_the_daemon_counts_refusals_by_code_and_times_each_answer(portal_db: str, site: Site) -> None:
    daemon = daemon_on(portal_db)
    daemon_requests(daemon)
    assert daemon.metrics is not None
    found = samples(generate_latest(daemon.metrics.registry).decode())
    refusals = {
        dict(labels)["code"] + "/" + dict(labels)["operation"]: v
        for (name, labels), v in found.items()
        if name == "gpucredit_refusals_total"
    }
    assert refusals == {"insufficient_credits/hold": 1, "unknown_op/unknown": 1, "rejected/submit": 1}
    counts = {
        dict(labels)["operation"]: v
        for (name, labels), v in found.items()
        if name == "gpucredit_daemon_request_duration_seconds_count"
    }
    assert counts == {"ping": 1, "hold": 1, "unknown": 1, "submit": 1}
    daemon.engine.dispose()


def test_the_daemon_serves_its_metrics_on_loopback_while_it_runs(
    portal_db: str, site: Site, sockdir: Path
) -> None:
    port = free_port()
    daemon = daemon_on(portal_db, port)
    ready, stop = threading.Event(), threading.Event()
    thread = threading.Thread(
        target=daemon.serve,
        args=(str(sockdir / "daemon.sock"),),
        kwargs={"release_interval": None, "ready": ready, "stop": stop},
    )
    thread.start()
    try:
        assert ready.wait(10)
        daemon.handle({"op": "ping"})
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            found = samples(response.read().decode())
        assert value(found, "gpucredit_daemon_request_duration_seconds_count", operation="ping") == 1.0
    finally:
        stop.set()
        thread.join(10)
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)


def test_metrics_port_0_turns_the_daemons_metrics_off(portal_db: str, site: Site) -> None:
    """Off: nothing served and nothing counted on the path every quote takes."""
    daemon = daemon_on(portal_db, 0)
    daemon_requests(daemon)  # answered as before
    assert daemon.metrics is None
    daemon.engine.dispose()


# --- the Grafana dashboard -------------------------------------------------------------------


def dashboard_expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def test_the_dashboard_is_a_grafana_dashboard_on_a_chosen_prometheus() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["schemaVersion"] >= 39
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert (variables["datasource"]["type"], variables["datasource"]["query"]) == ("datasource", "prometheus")
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
        assert panel["targets"], panel["title"]


def test_every_metric_the_dashboard_queries_is_exposed(
    portal_db: str, site: Site, client: FlaskClient
) -> None:
    with ledger_tx(portal_db) as s:  # so that both lags exist
        hold = api.find_active_hold(s, "default", 1003, None)
        assert hold is not None
        jobruns.write_cursor(s, "sacct", site.now, at=site.now)
        jobruns.write_cursor(s, "meter", site.now, at=site.now)
    client.get("/healthz")
    exposed = {name for name, _labels in scrape(client)}
    daemon = daemon_on(portal_db)
    daemon_requests(daemon)
    assert daemon.metrics is not None
    exposed |= {name for name, _labels in samples(generate_latest(daemon.metrics.registry).decode())}
    daemon.engine.dispose()
    queried = {name for expr in dashboard_expressions() for name in re.findall(r"\bgpucredit_\w+", expr)}
    assert queried - exposed == set()
    assert {"gpucredit_refusals_total", "gpucredit_daemon_request_duration_seconds_bucket"} <= queried


def test_daemon_metrics_need_no_daemon() -> None:
    metrics = DaemonMetrics(["hold"])
    metrics.observe({"not": "a string"}, 0.001, {"ok": False, "error": {"code": "bad_request"}})
    found = samples(generate_latest(metrics.registry).decode())
    assert value(found, "gpucredit_refusals_total", code="bad_request", operation="unknown") == 1.0


# --- the journal read a little at a time -------------------------------------------------------


def sums(totals: api.ChargeTotals) -> dict[str, Any]:
    return {
        "accounts": {k: (v.charged_ucredits, v.returned_ucredits) for k, v in totals.accounts.items()},
        "gres": {k: (v.charged_ucredits, v.gpu_seconds) for k, v in totals.gres.items()},
    }


def test_a_long_journal_is_read_over_several_scrapes_to_the_same_sums(portal_db: str, site: Site) -> None:
    small = api.ChargeCounter(batch_rows=2, max_rows_per_read=4)
    with ledger_tx(portal_db) as s:
        first = small.read(s)
        assert not first.caught_up
        while not (totals := small.read(s)).caught_up:
            pass
        whole = api.ChargeCounter().read(s)
    assert whole.caught_up
    assert sums(totals) == sums(whole)
    assert whole.accounts["physics"].charged_ucredits == 5_600_000


def test_an_entry_committed_after_a_newer_one_is_still_counted(pg_url: str) -> None:
    """On PostgreSQL an entry id becomes visible out of order when transactions commit
    out of order; a rolled-back id never does, and is forgotten after gap_seconds."""
    now = [0.0]
    counter = api.ChargeCounter(gap_seconds=120, clock=lambda: now[0])
    engine = make_engine(pg_url)
    sessions = make_sessionmaker(engine)
    try:
        with sessions() as s, s.begin():
            for account in ("physics", "chemistry"):
                api.create_account(s, account)
        for account in ("physics", "chemistry"):
            with sessions() as s, s.begin():
                api.topup(s, account, "100")

        def spent(account: str) -> int:
            with sessions() as s, s.begin():
                found = counter.read(s).accounts.get(account)
            return found.charged_ucredits if found else 0

        assert spent("physics") == 0
        with sessions() as slow:
            slow.begin()
            api.consume(slow, "physics", "1")  # an id taken, not yet committed
            with sessions() as s, s.begin():
                api.consume(s, "chemistry", "2")
            assert (spent("physics"), spent("chemistry")) == (0, 2_000_000)
            slow.commit()
        assert (spent("physics"), spent("chemistry")) == (1_000_000, 2_000_000)
        with sessions() as lost:
            lost.begin()
            api.consume(lost, "physics", "5")
            lost.rollback()
        with sessions() as s, s.begin():
            api.consume(s, "chemistry", "3")
        assert spent("chemistry") == 5_000_000
        assert len(counter._gaps) == 1
        now[0] += 121
        assert spent("physics") == 1_000_000
        assert counter._gaps == {}
    finally:
        engine.dispose()


def test_the_site_figures_on_both_stores(db_url: str) -> None:
    seed_site(db_url)
    with ledger_tx(db_url) as s:
        totals = {t.account: t for t in api.account_totals(s, utcnow())}
        charges = sums(api.ChargeCounter().read(s))
        assert api.memberships(s) == [("alice", "physics"), ("bob", "physics"), ("carol", "chemistry")]
    assert {name: (t.available_ucredits, t.held_ucredits, t.active_holds) for name, t in totals.items()} == {
        "chemistry": (39_000_000, 0, 0),
        "physics": (100_000_000, 14_400_000, 1),
    }
    assert charges == {
        "accounts": {"physics": (5_600_000, 0), "chemistry": (1_000_000, 0)},
        "gres": {("h100", "none"): (3_600_000, 3600), ("a100", "none"): (3_000_000, 5400)},
    }
