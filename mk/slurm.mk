# The Slurm box (slurmbox/): Slurm 22.05 with two nodes and fake GPUs on this host,
# wired to gpucredit -- how an admin tries it. Run as root. Included by the Makefile.
.PHONY: slurm-up slurm-down slurm-status

slurm-up: venv  ## start the Slurm box (installs the Debian packages if missing) and gpucredit on it; it outlives make
	$(BIN)/python -m slurmbox up

slurm-down:  ## stop it, drop its accounting database, wipe its state (job ids restart at 1); the ledger stays
	$(BIN)/python -m slurmbox down

slurm-status:  ## JSON: up?, daemon pids, hooks mode
	$(BIN)/python -m slurmbox status
