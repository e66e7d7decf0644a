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

# The Slurm end-to-end suite (tests/slurm's box tests; `make test` runs them on the host's
# 22.05) on each newer Slurm in its chroot box: one pytest session, one box start per
# version. The versions' own modules (test_slurm_versions*.py) are left out: `make test`
# runs them in every box already.
SLURM_VERSIONS ?= 24.11 26.05
.PHONY: test-slurm-versions
test-slurm-versions: venv  ## tests/slurm's box tests on each of SLURM_VERSIONS (as root; minutes each)
	@set -e; for v in $(SLURM_VERSIONS); do \
	  echo "== tests/slurm on Slurm $$v"; \
	  GPUCREDIT_E2E_SLURM=$$v $(BIN)/python -m pytest tests/slurm -m slurm \
	    --ignore=tests/slurm/test_slurm_versions.py --ignore=tests/slurm/test_slurm_versions_e2e.py; \
	done
