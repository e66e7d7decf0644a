# The cluster in a box (tests/slurmbox.py): Slurm 22.05 with two nodes and fake
# GPUs on this host, wired to gpucredit. Run as root. Included by the Makefile.
.PHONY: slurm-up slurm-down slurm-status

slurm-up: venv  ## start the Slurm box (installs the Debian packages if missing) and gpucredit on it; it outlives make
	.venv/bin/python -m tests.slurmbox up
	.venv/bin/python -m tests.boxledger up

slurm-down:  ## stop it, drop its accounting database, wipe its state (job ids restart at 1)
	-.venv/bin/python -m tests.boxledger down
	.venv/bin/python -m tests.slurmbox down

slurm-status:  ## JSON: up?, daemon pids, hooks mode
	.venv/bin/python -m tests.slurmbox status
