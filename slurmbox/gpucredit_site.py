"""gpucredit on the Slurm box for people trying it: `make slurm-up` runs this after the box.

Writes /etc/gpucredit/gpucredit.toml (unless one exists), creates the embedded
database, mirrors Slurm's accounts, sets the demo prices when none are set, installs
the hooks and starts `gpucredit daemon` in the background. Then:

    gpucredit topup physics 100
    runuser -u alice -- sbatch -A physics --gres=gpu:h100:2 -t 10 --wrap 'sleep 30'
    gpucredit hold list; gpucredit balance physics
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GPUCREDIT = str(REPO / ".venv" / "bin" / "gpucredit")
CONFIG = Path(os.environ.get("GPUCREDIT_CONFIG", "/etc/gpucredit/gpucredit.toml"))
PID_FILE = Path("/run/gpucredit/daemon.pid")
LOG_DIR = Path("/var/log/gpucredit")
CONFIG_TEXT = """# gpucredit on the Slurm box (written by `make slurm-up`; edit freely, it is kept)
[database]
url = "sqlite:////var/lib/gpucredit/gpucredit.db"

[daemon]
socket = "/run/gpucredit/daemon.sock"

[policy]
on_ledger_unreachable = "reject"

[slurm]
cluster = "lab"

[hooks]
log_file = "/var/log/gpucredit/hooks.log"

[agent]
spool_dir = "/var/spool/gpucredit/%n"
"""


def gpucredit(*args: str) -> str:
    env = {**os.environ, "GPUCREDIT_CONFIG": str(CONFIG)}
    return subprocess.run([GPUCREDIT, *args], env=env, check=True, capture_output=True, text=True).stdout


def running_pid() -> int | None:
    try:
        pid = int(PID_FILE.read_text())
        status = Path(f"/proc/{pid}/status").read_text()
    except (OSError, ValueError):
        return None
    return None if "State:\tZ" in status else pid


def up() -> None:
    if not CONFIG.exists():
        CONFIG.parent.mkdir(parents=True, exist_ok=True)
        CONFIG.write_text(CONFIG_TEXT)
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    print(gpucredit("init").strip())
    print(gpucredit("account", "import-slurm").strip())
    if gpucredit("price", "list", "--format", "csv").count("\n") <= 1:
        gpucredit("price", "set", "a100", "2.00")
        gpucredit("price", "set", "h100", "3.60")
    gpucredit("slurm", "install", "--config", str(CONFIG))
    if running_pid() is None:
        PID_FILE.parent.mkdir(parents=True, exist_ok=True)
        with open(LOG_DIR / "daemon.log", "ab") as log:
            proc = subprocess.Popen(
                [GPUCREDIT, "daemon"],
                env={**os.environ, "GPUCREDIT_CONFIG": str(CONFIG)},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        PID_FILE.write_text(f"{proc.pid}\n")
        socket = Path("/run/gpucredit/daemon.sock")
        deadline = time.monotonic() + 20
        while not socket.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"gpucredit daemon did not start; see {LOG_DIR / 'daemon.log'}")
            time.sleep(0.1)
    print(
        f"gpucredit daemon running (pid {running_pid()}); config {CONFIG}; hook log {LOG_DIR / 'hooks.log'}"
    )
    print(
        "try: gpucredit topup physics 100 && runuser -u alice -- sbatch -A physics "
        "--gres=gpu:h100:2 -t 10 --wrap 'sleep 30'"
    )


def down() -> None:
    pid = running_pid()
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
    PID_FILE.unlink(missing_ok=True)


if __name__ == "__main__":
    {"up": up, "down": down}[sys.argv[1]]()
