# The Slurm box (slurmbox/): Slurm with three nodes and fake GPUs on this host,
# wired to gpucredit -- how an admin tries it. Run as root. Included by the Makefile.
# SLURM=22.05 (default): the host's Slurm (Debian 12). SLURM=24.11 / 26.05: Debian
# trixie's / sid's in a chroot (slurmbox/chroot.py; its root filesystem is built once
# with debootstrap and cached under /var/cache/gpucredit-box). Commands in a box:
# `python -m slurmbox run --slurm $(SLURM) [-u alice] -- CMD ARGS...`.
SLURM ?= 22.05
.PHONY: slurm-up slurm-down slurm-status slurm-rootfs

slurm-up: venv  ## start the Slurm box (installs the Debian packages if missing) and gpucredit on it; it outlives make
	$(BIN)/python -m slurmbox up --slurm $(SLURM)

slurm-down:  ## stop it, drop its accounting database, wipe its state (job ids restart at 1); the ledger stays
	$(BIN)/python -m slurmbox down --slurm $(SLURM)

slurm-status:  ## JSON: up?, daemon pids, hooks mode
	$(BIN)/python -m slurmbox status --slurm $(SLURM)

slurm-rootfs: venv  ## build (or find cached) the root filesystem of a chroot version (SLURM=24.11|26.05)
	$(BIN)/python -m slurmbox rootfs --slurm $(SLURM)
