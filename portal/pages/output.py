"""The tail of a job's output file, for the job's own user only.

The portal runs as its own service user; it may be able to read files it should not
show. So a tail is shown only to the user who ran the job, only from a regular file
(never through a symlink, which a user could point at another user's file) that the
job's user owns on this host.
"""

from __future__ import annotations

import os
import pwd
import stat

TAIL_LINES = 50
TAIL_BYTES = 64 * 1024


def output_tail(path: str | None, owner: str, lines: int = TAIL_LINES) -> str | None:
    """The last `lines` lines of `path` if it is a regular file owned by `owner`, else None."""
    if not path or not os.path.isabs(path):
        return None
    try:
        uid = pwd.getpwnam(owner).pw_uid
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except (KeyError, OSError):
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != uid:
            return None
        handle.seek(max(0, info.st_size - TAIL_BYTES))
        data = handle.read(TAIL_BYTES)
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])
