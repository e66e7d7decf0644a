"""`python -m slurmbox up | down | status` (make slurm-up / slurm-down / slurm-status).

up: start the box (detached; it outlives the command) and gpucredit on it.
down: stop gpucredit's daemon and the box; the box's Slurm state and accounting
database go (job ids restart at 1), gpucredit's ledger and config stay.
status: the box as JSON; exit 1 when it is not up.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from slurmbox import gpucredit_site
from slurmbox.box import LOG_DIR, BoxError, SlurmBox, supervise

USAGE = "usage: python -m slurmbox up|down|status"


def main(argv: Sequence[str]) -> int:
    if len(argv) == 2 and argv[0] == "_supervise":
        return supervise(int(argv[1]))
    if len(argv) != 1 or argv[0] not in ("up", "down", "status"):
        print(USAGE, file=sys.stderr)
        return 2
    box = SlurmBox()
    try:
        if argv[0] == "up":
            was_up = box.is_up()
            seconds = box.up(detach=True)
            state = "already up" if was_up else f"up in {seconds:.1f} s"
            print(f"Slurm box {state}; hooks: {box.status()['hooks']}; logs in {LOG_DIR}")
            if box.resolved_hooks() == "gpucredit":
                print("\n".join(gpucredit_site.up()))
        elif argv[0] == "down":
            gpucredit_site.down()
            print(f"Slurm box down in {box.down():.1f} s")
        else:
            print(json.dumps(box.status(), indent=1))
            return 0 if box.is_up() else 1
    except BoxError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
