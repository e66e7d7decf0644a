"""job_submit/job_submit.lua under the lua5.1 interpreter: the harness its tests share.

The `slurm` table is stubbed the way Slurm 22.05 builds it (log_user/log_info/
log_error are `string.format` wrappers; SUCCESS=0, ERROR=-1), job_desc and the
partition records behave like userdata (fields by name; pairs() sees nothing).
Used by tests/hooks/test_job_submit_lua.py and, on each Slurm version's recorded
job_desc, tests/hooks/test_job_submit_lua_versions.py.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support import REPO
from tests.support.services import require

SCRIPT = REPO / "job_submit" / "job_submit.lua"
NO_VAL = 4294967294
INFINITE = 4294967295
UNAVAILABLE = (
    "gpucredit: credit check unavailable (ledger unreachable); job refused by site policy; "
    "try again shortly or contact your admin"
)
UNCHECKED = (
    "gpucredit: credit check unavailable (ledger unreachable); job accepted by site policy, "
    "unquoted; it is charged once the ledger is back"
)


def lua_problem() -> str | None:
    lua = shutil.which("lua5.1")
    if lua is None:
        return "lua5.1 interpreter not found (apt-get install lua5.1)"
    probe = subprocess.run(
        [lua, "-e", 'require("socket"); require("socket.unix")'],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if probe.returncode != 0:
        return f"luasocket not usable from lua5.1 (apt-get install lua-socket): {probe.stderr.strip()}"
    return None


def require_lua() -> None:
    """Skip outside CI, fail in CI (tests.support.services.require), when job_submit.lua
    cannot run here: the fixture every module that runs it uses."""
    problem = lua_problem()
    require(problem is None, "job_submit.lua under lua5.1", problem or "")


# --- fake daemon -----------------------------------------------------------------------


def decision(verdict: str, message: str) -> dict[str, Any]:
    return {"ok": True, "result": {"decision": verdict, "message": message}}


# --- running the script -----------------------------------------------------------------


def lua_literal(value: Any) -> str:
    """A Lua expression for `value`; strings byte-exact via decimal escapes."""
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        value = value.encode("utf-8")
    if isinstance(value, bytes):
        return '"' + "".join(f"\\{b:03d}" for b in value) + '"'
    if isinstance(value, dict):
        items = ",".join(f"[{lua_literal(k)}]={lua_literal(v)}" for k, v in value.items())
        return "{" + items + "}"
    raise TypeError(value)


DRIVER = r"""
local captured = { USER = {}, INFO = {}, ERROR = {} }
local function capture(kind)
    -- Slurm's own definition: slurm.user_msg(string.format(unpack({...})))
    return function(...) table.insert(captured[kind], string.format(...)) end
end
slurm = {
    SUCCESS = 0, ERROR = -1, FAILURE = -1, NO_VAL = 4294967294, INFINITE = 4294967295,
    log_user = capture("USER"), log_info = capture("INFO"), log_error = capture("ERROR"),
}
%(prelude)s
local loaded = dofile(%(script)s)

-- Slurm lets job_submit write some fields (a routed job's partition, comment, AdminComment);
-- writing any other is a test failure.
local written
local function userdata_like(fields, writable)
    return setmetatable({}, {
        __index = fields,
        __newindex = function(_, key, value)
            if not (writable and writable[key]) then error("job_desc." .. key .. " written") end
            fields[key] = value
            written[#written + 1] = key
        end,
    })
end
local function hex(s)
    return (s:gsub(".", function(c) return string.format("%%02x", c:byte()) end))
end
print("LOADED " .. tostring(loaded))

-- Each submission in the same Lua state, as slurmctld keeps it; between two the test
-- acts on the daemon, then says go on (a line on stdin).
for submission = 1, %(submissions)d do
    if submission > 1 then
        io.read("*l")
    end
    written = {}
    for _, kind in pairs(captured) do
        for i = #kind, 1, -1 do kind[i] = nil end
    end
    local job_desc = userdata_like(%(job_desc)s, { partition = true, comment = true, admin_comment = true })
    local part_list = {}
    for name, fields in pairs(%(partitions)s) do
        part_list[name] = userdata_like(fields)
    end
    local rc = slurm_job_submit(job_desc, part_list, 1001)
    local modify_rc = slurm_job_modify(job_desc, job_desc, part_list, 0)
    print("RC " .. tostring(rc))
    print("MODIFY " .. tostring(modify_rc))
    for _, key in ipairs(written) do
        print("SET " .. key .. " " .. hex(tostring(job_desc[key])))
    end
    for _, kind in ipairs({ "USER", "INFO", "ERROR" }) do
        for _, message in ipairs(captured[kind]) do
            print(kind .. " " .. hex(message))
        end
    end
    print("DONE")
    io.stdout:flush()
end
"""


@dataclass
class Outcome:
    loaded: int
    rc: int
    modify_rc: int
    user: list[str] = field(default_factory=list)
    info: list[str] = field(default_factory=list)
    error: list[str] = field(default_factory=list)
    written: dict[str, str] = field(default_factory=dict)  # job_desc fields the script set


JOB_DESC: dict[str, Any] = {
    # sbatch -p debug --gres=gpu:h100:2 -t 2:00:00 (user alice, no -A)
    "user_name": "alice",
    "user_id": 1001,
    "group_id": 1001,
    "default_account": "physics",
    "partition": "debug",
    "tres_per_node": "gres:gpu:h100:2",
    "gres": "gres:gpu:h100:2",
    "time_limit": 120,
    "num_tasks": NO_VAL,
    "min_nodes": NO_VAL,
    "cpus_per_task": 65534,
    "name": "train",
    "script": "#!/bin/sh\nsrun python train.py\n",
}
PARTITIONS: dict[str, Any] = {
    "debug": {"name": "debug", "default_time": NO_VAL, "max_time": INFINITE, "flag_default": 1},
    "long": {"name": "long", "default_time": 60, "max_time": 2880, "flag_default": 0},
}


def run_script(tmp_path: Path, socket_path: str, **options: Any) -> Outcome:
    """One submission to a freshly loaded script (options: run_submissions's)."""
    [outcome] = run_submissions(tmp_path, socket_path, **options)
    return outcome


def run_submissions(
    tmp_path: Path,
    socket_path: str,
    *,
    between: Sequence[Callable[[], None]] = (),
    policy: str = "reject",
    timeout: str = "1.0",
    job_desc: dict[str, Any] | None = None,
    partitions: dict[str, Any] | None = None,
    prelude: str = "",
    substitute: bool = True,
) -> list[Outcome]:
    """len(between) + 1 submissions to one loaded script, as slurmctld keeps it; each of
    `between` is called after the submission before it has been answered."""
    text = SCRIPT.read_text()
    if substitute:
        text = text.replace("@SOCKET@", socket_path).replace("@POLICY@", policy).replace("@TIMEOUT@", timeout)
    script = tmp_path / "job_submit.lua"
    script.write_text(text)
    driver = tmp_path / "driver.lua"
    driver.write_text(
        DRIVER
        % {
            "prelude": prelude,
            "script": lua_literal(str(script)),
            "job_desc": lua_literal(JOB_DESC if job_desc is None else job_desc),
            "partitions": lua_literal(PARTITIONS if partitions is None else partitions),
            "submissions": len(between) + 1,
        }
    )
    pipe = subprocess.PIPE
    lua = subprocess.Popen(["lua5.1", str(driver)], stdin=pipe, stdout=pipe, stderr=pipe, text=True)
    assert lua.stdin is not None and lua.stdout is not None
    try:
        loaded = lua.stdout.readline()
        assert loaded.startswith("LOADED "), loaded + lua.communicate(timeout=30)[1]
        outcomes = []
        for step in [*between, None]:
            lines: list[str] = []
            while (line := lua.stdout.readline()) != "DONE\n":
                assert line, "".join(lines) + lua.communicate(timeout=30)[1]  # it ended early
                lines.append(line)
            outcomes.append(_outcome(int(loaded.split()[1]), lines))
            if step is not None:
                step()
                lua.stdin.write("go\n")
                lua.stdin.flush()
        _, stderr = lua.communicate(timeout=30)
        assert lua.returncode == 0, stderr
    finally:
        if lua.poll() is None:
            lua.kill()
            lua.wait()
    return outcomes


def _outcome(loaded: int, lines: list[str]) -> Outcome:
    values: dict[str, int] = {}
    logs: dict[str, list[str]] = {"USER": [], "INFO": [], "ERROR": []}
    written: dict[str, str] = {}
    for line in lines:
        kind, _, rest = line.rstrip("\n").partition(" ")
        if kind == "SET":
            key, _, value = rest.partition(" ")
            written[key] = bytes.fromhex(value).decode("utf-8")
        elif kind in logs:
            logs[kind].append(bytes.fromhex(rest).decode("utf-8"))
        else:
            values[kind] = int(rest)
    return Outcome(loaded, values["RC"], values["MODIFY"], logs["USER"], logs["INFO"], logs["ERROR"], written)
