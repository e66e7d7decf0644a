"""The Slurm box: Slurm 22.05 with two nodes and fake GPUs on one host, wired to gpucredit.

How an admin tries gpucredit (`make slurm-up`, i.e. `python -m slurmbox up`) and
where the end-to-end tests run. `slurmbox.box` runs Slurm; `slurmbox.gpucredit_site`
sets gpucredit up on it (config, ledger, prices, hooks, daemon). Other Slurm
versions (`make slurm-up SLURM=24.11|26.05`) run the same box in a Debian chroot:
`slurmbox.versions`, `slurmbox.rootfs`, `slurmbox.chroot`.
"""

from slurmbox.box import BoxError, SlurmBox, parse_scontrol, run

__all__ = ["BoxError", "SlurmBox", "parse_scontrol", "run"]
