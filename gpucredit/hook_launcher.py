"""`gpucredit hook <name>` without `site`: what the hook shims run, as
`python -I -S /path/to/gpucredit/hook_launcher.py hook <name>`.

Slurm starts a hook process for every job. `site` (site-packages and their .pth files,
and with an editable install its import hook) cost 3-9 ms of each start here, and the
hooks need none of it: they import the standard library and gpucredit's own packages,
which sit beside this file's package (site-packages, or a source checkout), so that
directory is put on the path (after the standard library) and nothing else. `-I` keeps
the hook's path free of the environment's PYTHON* variables and of Slurm's working
directory.
"""

import os
import sys

if __name__ == "__main__":  # a script only: importing it must not touch sys.path
    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from gpucredit.cli import main

    main()
