"""job_submit/job_submit.lua under the lua5.1 interpreter, against a fake daemon.

The `slurm` table is stubbed the way Slurm 22.05 builds it (log_user/log_info/
log_error are `string.format` wrappers; SUCCESS=0, ERROR=-1), job_desc and
the partition records behave like userdata (fields by name; pairs() sees
nothing), and the daemon is a real threaded Unix-socket server.

Needs `lua5.1` and `lua-socket` (apt-get install lua5.1 lua-socket): skipped
with a hint where they are missing, a failure under CI (env CI set).
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.fakedaemon import CLOSE, HANG, FakeDaemon, Responder
from tests.support.fakedaemon import fake_daemon as fake_daemon
from tests.support.fakedaemon import sockdir as sockdir
from tests.support.lua_job_submit import (
    INFINITE,
    JOB_DESC,
    NO_VAL,
    SCRIPT,
    UNAVAILABLE,
    UNCHECKED,
    decision,
    lua_literal,
    require_lua,
    run_script,
    run_submissions,
)


@pytest.fixture(scope="module", autouse=True)
def lua_available() -> None:
    require_lua()


# --- decisions ------------------------------------------------------------------------------


def test_reject_prints_the_message_and_returns_error(
    fake_daemon: Callable[[Responder], FakeDaemon], tmp_path: Path
) -> None:
    message = (
        "gpucredit: job needs ~14.40 credits (2×h100 × 2 h), 3.00 available in physics; "
        "top up at https://portal.example/accounts/physics"
    )
    daemon = fake_daemon(lambda _: decision("reject", message))
    outcome = run_script(tmp_path, daemon.path)
    assert outcome.loaded == 0
    assert outcome.rc == -1
    assert outcome.user == [message]
    assert outcome.info == [f"gpucredit: user alice: refused: {message}"]
    assert outcome.error == []
    assert outcome.modify_rc == 0


def test_accept_with_an_estimate(fake_daemon: Callable[[Responder], FakeDaemon], tmp_path: Path) -> None:
    message = "gpucredit: ~14.40 credits (2×h100 × 2 h), 112.40 available in physics"
    daemon = fake_daemon(lambda _: decision("accept", message))
    outcome = run_script(tmp_path, daemon.path)
    assert (outcome.rc, outcome.user, outcome.error) == (0, [message], [])


def test_a_routed_job_gets_its_partitions_and_the_decision_in_its_comment(
    fake_daemon: Callable[[Responder], FakeDaemon], tmp_path: Path
) -> None:
    message = "gpucredit: ~0.09 credits at most (1×h100 × 1 min) in onprem (~0.06) or cloud (~0.09), ..."
    comment = "gpucredit: routed to onprem,cloud (limit 1.00 a run, cloud allowed): ... | nightly"
    result = {"decision": "accept", "message": message, "partition": "onprem,cloud", "comment": comment}
    daemon = fake_daemon(lambda _: {"ok": True, "result": result})
    user_comment = "nightly gpucredit:max_cost=1,cloud=yes"
    outcome = run_script(tmp_path, daemon.path, job_desc={**JOB_DESC, "comment": user_comment})
    assert daemon.requests[0]["comment"] == user_comment  # the daemon parses it, not the script
    assert (outcome.rc, outcome.user, outcome.error) == (0, [message], [])
    assert outcome.written == {"partition": "onprem,cloud", "comment": comment}
    assert outcome.info == [f"gpucredit: user alice: {comment}"]


@pytest.mark.parametrize("route", [{"partition": 7}, {"partition": "onprem", "comment": ["x"]}])
def test_a_garbled_route_writes_nothing_and_follows_policy(
    fake_daemon: Callable[[Responder], FakeDaemon], tmp_path: Path, route: dict[str, Any]
) -> None:
    daemon = fake_daemon(lambda _: {"ok": True, "result": {"decision": "accept", "message": "m", **route}})
    outcome = run_script(tmp_path, daemon.path, policy="reject")
    assert (outcome.rc, outcome.user, outcome.written) == (-1, [UNAVAILABLE], {})


def test_accept_silently(fake_daemon: Callable[[Responder], FakeDaemon], tmp_path: Path) -> None:
    daemon = fake_daemon(lambda _: decision("accept", ""))
    outcome = run_script(tmp_path, daemon.path, job_desc={**JOB_DESC, "tres_per_node": None})
    assert (outcome.rc, outcome.user, outcome.error) == (0, [], [])
    assert "tres_per_node" not in daemon.requests[0]  # jobs without GPUs are forwarded too


def test_request_carries_the_exact_raw_fields(
    fake_daemon: Callable[[Responder], FakeDaemon], tmp_path: Path
) -> None:
    daemon = fake_daemon(lambda _: decision("accept", ""))
    job_desc = {
        **JOB_DESC,
        "account": "research",
        "tres_per_job": "gres:gpu:a100:2",
        "tres_per_task": "gres:gpu:a100:1",
        "array_inx": "0-15%4",
        "num_tasks": 4,
        "min_nodes": 2,
        "time_limit": NO_VAL,
    }
    run_script(tmp_path, daemon.path, job_desc=job_desc)
    assert daemon.requests == [
        {
            "op": "submit",
            "user_name": "alice",
            "user_id": 1001,
            "account": "research",
            "default_account": "physics",
            "partition": "debug",
            "tres_per_node": "gres:gpu:h100:2",
            "tres_per_job": "gres:gpu:a100:2",
            "tres_per_task": "gres:gpu:a100:1",
            "time_limit": NO_VAL,
            "num_tasks": 4,
            "min_nodes": 2,
            "array_inx": "0-15%4",
            "partitions": {
                "debug": {"default_time": NO_VAL, "max_time": INFINITE, "default": True},
                "long": {"default_time": 60, "max_time": 2880, "default": False},
            },
        }
    ]
    # One line, keys in a fixed order.
    assert daemon.raw_requests[0].startswith(b'{"op":"submit","user_name":"alice","user_id":1001,')
    assert daemon.raw_requests[0].endswith(b"}\n")


def test_nil_fields_are_left_out(fake_daemon: Callable[[Responder], FakeDaemon], tmp_path: Path) -> None:
    daemon = fake_daemon(lambda _: decision("accept", ""))
    job_desc = {"user_name": "alice", "user_id": 1001, "time_limit": NO_VAL}
    run_script(tmp_path, daemon.path, job_desc=job_desc, partitions={})
    assert daemon.requests == [
        {"op": "submit", "user_name": "alice", "user_id": 1001, "time_limit": NO_VAL, "partitions": {}}
    ]


def test_request_strings_are_escaped(fake_daemon: Callable[[Responder], FakeDaemon], tmp_path: Path) -> None:
    daemon = fake_daemon(lambda _: decision("accept", ""))
    job_desc = {
        **JOB_DESC,
        "user_name": 'o"brien\\x\n\t\x01ü€𝄞',
        "array_inx": b"bad\xffbyte",  # not UTF-8: replaced, not forwarded raw
        "partition": "a,b",
    }
    run_script(tmp_path, daemon.path, job_desc=job_desc, partitions={'p"1': {"max_time": 5}})
    request = daemon.requests[0]
    assert request["user_name"] == 'o"brien\\x\n\t\x01ü€𝄞'
    assert request["array_inx"] == "bad\ufffdbyte"
    assert request["partition"] == "a,b"
    assert request["partitions"] == {'p"1': {"max_time": 5}}


def test_message_with_quotes_newlines_and_unicode_round_trips(
    fake_daemon: Callable[[Responder], FakeDaemon], tmp_path: Path
) -> None:
    message = 'say "hi"\nback\\slash\ttab 100% sure %s %d ü € 𝄞 \x01 / end'
    daemon = fake_daemon(lambda _: decision("reject", message))
    outcome = run_script(tmp_path, daemon.path)
    assert outcome.rc == -1
    assert outcome.user == [message]


def test_reply_escapes_and_extra_fields_are_decoded(
    fake_daemon: Callable[[Responder], FakeDaemon], tmp_path: Path
) -> None:
    raw = (
        b'{ "ok" : true , "result" : { "decision" : "accept", '
        b'"message" : "a\\/b\\u00e9\\ud834\\udd1e\\b\\f\\r|\\ud800x",'
        b' "estimate": {"credits": "14.40", "gpus": [1, 2.5e0, -3], "x": null, "y": false},'
        b' "empty": {}, "list": [] } }\r\n'
    )
    daemon = fake_daemon(lambda _: raw)
    outcome = run_script(tmp_path, daemon.path)
    assert outcome.rc == 0
    assert outcome.user == ["a/bé𝄞\b\f\r|\ufffdx"]


# --- failures follow the policy -------------------------------------------------------------


@pytest.mark.parametrize("policy", ["reject", "accept"])
def test_daemon_down_follows_policy(sockdir: Path, tmp_path: Path, policy: str) -> None:
    outcome = run_script(tmp_path, str(sockdir / "nobody.sock"), policy=policy)
    if policy == "reject":
        assert outcome.rc == -1
        assert outcome.user == [UNAVAILABLE]
        assert len(outcome.error) == 1
        assert outcome.error[0].startswith("gpucredit: credit check failed (cannot connect to ")
        assert outcome.error[0].endswith("; job refused by site policy")
    else:
        assert outcome.rc == 0
        assert outcome.user == [UNCHECKED]
        assert outcome.error == []
        assert "job accepted by site policy" in outcome.info[0]


@pytest.mark.parametrize("policy", ["reject", "accept"])
def test_daemon_timeout_follows_policy(
    fake_daemon: Callable[[Responder], FakeDaemon], tmp_path: Path, policy: str
) -> None:
    daemon = fake_daemon(lambda _: HANG)
    outcome = run_script(tmp_path, daemon.path, policy=policy, timeout="0.3")
    assert outcome.rc == (-1 if policy == "reject" else 0)
    assert "timeout" in (outcome.error + outcome.info)[0]
    assert len(daemon.requests) == 1


@pytest.mark.parametrize(
    "reply",
    [
        b"DENY\n",
        b'{"ok": true, "result": {"decision": "maybe", "message": "?"}}\n',
        b'{"ok": true, "result": {"decision": "accept"}} trailing\n',
        b'{"ok": false, "error": {"code": "internal", "message": "boom"}}\n',
        b'{"ok": true, "result": {"decision": "accept", "message": "unterminated}}\n',
        b'{"ok": true, "result": "accept"}\n',
        b"[1, 2]\n",
        b"\n",
    ],
)
def test_garbled_or_error_reply_follows_policy(
    fake_daemon: Callable[[Responder], FakeDaemon], tmp_path: Path, reply: bytes
) -> None:
    daemon = fake_daemon(lambda _: reply)
    outcome = run_script(tmp_path, daemon.path, policy="reject")
    assert outcome.rc == -1
    assert outcome.user == [UNAVAILABLE]
    outcome = run_script(tmp_path, daemon.path, policy="accept")
    assert outcome.rc == 0
    assert outcome.user == [UNCHECKED]


def test_missing_luasocket_still_loads_and_follows_policy(tmp_path: Path, sockdir: Path) -> None:
    prelude = 'package.path = ""; package.cpath = ""'
    outcome = run_script(tmp_path, str(sockdir / "x.sock"), prelude=prelude)
    assert outcome.loaded == 0
    assert outcome.rc == -1
    assert "luasocket" in outcome.error[0]
    outcome = run_script(tmp_path, str(sockdir / "x.sock"), policy="accept", prelude=prelude)
    assert outcome.rc == 0


def test_unknown_policy_value_fails_closed(sockdir: Path, tmp_path: Path) -> None:
    outcome = run_script(tmp_path, str(sockdir / "nobody.sock"), policy="Accept ")
    assert outcome.rc == -1


# Whatever listens at the default path on this machine, the script must only try it:
# a stub socket.unix refuses every connection and leaves the path in the error.
REFUSING_UNIX = """
package.loaded["socket.unix"] = {stream = function()
  return {settimeout = function() return 1 end, close = function() end,
          connect = function(self, path) return nil, "connection refused (stub) " .. path end}
end}
"""


def test_unsubstituted_placeholders_use_the_defaults(tmp_path: Path) -> None:
    outcome = run_script(tmp_path, "", substitute=False, prelude=REFUSING_UNIX)
    assert outcome.loaded == 0
    assert outcome.rc == -1  # default policy: reject
    assert "/run/gpucredit/daemon.sock" in outcome.error[0]
    assert outcome.user == [UNAVAILABLE]


def test_script_is_valid_lua_as_shipped() -> None:
    check = f"assert(loadfile({lua_literal(str(SCRIPT))}))"
    done = subprocess.run(["lua5.1", "-e", check], capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr


# --- two controllers: every daemon in turn, within one timeout ---------------------------------

ACCEPTED = "gpucredit: ~14.40 credits (2×h100 × 2 h), 112.40 available in physics"


@pytest.mark.parametrize("primary", ["missing", "hanging", "unavailable", "garbled"])
def test_the_backup_daemon_answers_when_the_primary_cannot(
    fake_daemon: Callable[[Responder], FakeDaemon], sockdir: Path, tmp_path: Path, primary: str
) -> None:
    replies = {
        "hanging": HANG,
        "unavailable": {"ok": False, "error": {"code": "unavailable", "message": "ledger down"}},
        "garbled": b"DENY\n",
    }
    first = None if primary == "missing" else fake_daemon(lambda _: replies[primary])
    backup = fake_daemon(lambda _: decision("accept", ACCEPTED))
    first_path = str(sockdir / "gone.sock") if first is None else first.path
    outcome = run_script(tmp_path, f"{first_path} {backup.path}", timeout="0.6")
    assert (outcome.rc, outcome.user, outcome.error) == (0, [ACCEPTED], [])
    assert len(backup.requests) == 1
    assert first is None or len(first.requests) == 1


def test_a_refusal_from_the_primary_is_final(
    fake_daemon: Callable[[Responder], FakeDaemon], tmp_path: Path
) -> None:
    refusal = "gpucredit: job refused: account physics has 1.00 credits available; this job needs ~14.40"
    primary = fake_daemon(lambda _: decision("reject", refusal))
    backup = fake_daemon(lambda _: decision("accept", ACCEPTED))
    outcome = run_script(tmp_path, f"{primary.path} {backup.path}")
    assert (outcome.rc, outcome.user) == (-1, [refusal])
    assert backup.requests == []


def test_both_daemons_down_follows_policy_naming_the_last(sockdir: Path, tmp_path: Path) -> None:
    outcome = run_script(tmp_path, f"{sockdir / 'a.sock'} {sockdir / 'b.sock'}")
    assert (outcome.rc, outcome.user) == (-1, [UNAVAILABLE])
    assert outcome.error[0].startswith(
        f"gpucredit: credit check failed (cannot connect to {sockdir / 'b.sock'}"
    )


# --- one connection kept between submissions -------------------------------------------------


def answers(*replies: Any) -> Responder:
    """A responder giving `replies` in turn, one per request."""
    queue = list(replies)
    return lambda _: queue.pop(0)


def test_one_connection_serves_every_submission(
    fake_daemon: Callable[[Responder], FakeDaemon], tmp_path: Path
) -> None:
    daemon = fake_daemon(lambda _: decision("accept", ACCEPTED))
    outcomes = run_submissions(tmp_path, daemon.path, between=[lambda: None] * 2)
    assert [(o.rc, o.user, o.error) for o in outcomes] == [(0, [ACCEPTED], [])] * 3
    assert (len(daemon.requests), daemon.connections) == (3, 1)


@pytest.mark.parametrize("how", ["idle", "restarted"])
def test_a_connection_the_daemon_closed_is_replaced(
    fake_daemon: Callable[[Responder], FakeDaemon], tmp_path: Path, how: str
) -> None:
    daemon = fake_daemon(lambda _: decision("accept", ACCEPTED))
    restarted: list[FakeDaemon] = []

    def close() -> None:
        if how == "idle":  # the daemon closes a connection idle for 30 s
            daemon.hang_up()
        else:
            daemon.stop()
            Path(daemon.path).unlink()
            restarted.append(FakeDaemon(daemon.path, lambda _: decision("reject", "gpucredit: refused")))

    try:
        first, second = run_submissions(tmp_path, daemon.path, between=[close])
    finally:
        for again in restarted:
            again.stop()
    assert (first.rc, first.user) == (0, [ACCEPTED])
    if how == "idle":
        assert (second.rc, second.user, second.error) == (0, [ACCEPTED], [])
        assert (len(daemon.requests), daemon.connections) == (2, 2)
    else:
        assert (second.rc, second.user, second.error) == (-1, ["gpucredit: refused"], [])
        assert (len(restarted[0].requests), restarted[0].connections) == (1, 1)


def test_a_kept_connection_closed_unanswered_is_asked_again_once(
    fake_daemon: Callable[[Responder], FakeDaemon], tmp_path: Path
) -> None:
    # The daemon hangs up on the second job's line as it arrives (its idle close racing
    # the send): asked again on a new connection. A daemon that hangs up on that one too
    # is not asked a third time.
    refusal = decision("reject", "gpucredit: refused")
    daemon = fake_daemon(answers(decision("accept", ACCEPTED), CLOSE, refusal, CLOSE, CLOSE))
    first, second, third = run_submissions(tmp_path, daemon.path, between=[lambda: None] * 2)
    assert (first.rc, first.user) == (0, [ACCEPTED])
    assert (second.rc, second.user, second.error) == (-1, ["gpucredit: refused"], [])
    assert (third.rc, third.user) == (-1, [UNAVAILABLE])
    assert third.error[0].startswith("gpucredit: credit check failed (no reply from ")
    assert (len(daemon.requests), daemon.connections) == (5, 3)


def test_a_fresh_connection_closed_unanswered_is_not_asked_again(
    fake_daemon: Callable[[Responder], FakeDaemon], tmp_path: Path
) -> None:
    daemon = fake_daemon(answers(CLOSE, decision("accept", ACCEPTED)))
    outcome = run_script(tmp_path, daemon.path)
    assert (outcome.rc, outcome.user) == (-1, [UNAVAILABLE])
    assert (len(daemon.requests), daemon.connections) == (1, 1)


def test_a_late_reply_is_never_read_as_the_next_jobs_answer(
    fake_daemon: Callable[[Responder], FakeDaemon], tmp_path: Path
) -> None:
    late = threading.Event()

    def respond(request: dict[str, Any]) -> Any:
        if len(daemon.requests) == 1:
            late.wait(10)  # past the script's timeout: the first job follows the policy
            return decision("reject", "gpucredit: the first job's late answer")
        return decision("accept", ACCEPTED)

    daemon = fake_daemon(respond)
    first, second = run_submissions(tmp_path, daemon.path, timeout="0.3", between=[late.set])
    assert (first.rc, first.user) == (-1, [UNAVAILABLE])
    assert "timeout" in first.error[0]
    assert (second.rc, second.user, second.error) == (0, [ACCEPTED], [])
    assert daemon.connections == 2


def test_the_backup_answers_once_the_primary_with_a_kept_connection_is_gone(
    fake_daemon: Callable[[Responder], FakeDaemon], tmp_path: Path
) -> None:
    primary = fake_daemon(lambda _: decision("accept", "from the primary"))
    backup = fake_daemon(lambda _: decision("accept", ACCEPTED))
    first, second = run_submissions(tmp_path, f"{primary.path} {backup.path}", between=[primary.stop])
    assert (first.user, second.user, second.error) == (["from the primary"], [ACCEPTED], [])
    assert (len(primary.requests), len(backup.requests)) == (1, 1)
