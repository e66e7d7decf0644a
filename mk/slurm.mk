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
# 22.05) on each newer Slurm in its chroot box, one box start per version: the box comes
# up as `make slurm-up` brings it (gpucredit's own daemons and hooks), the versions' own
# modules (test_slurm_versions*.py, which use those) run first, then the rest of the
# suite (each module wires the box to a ledger of its own and puts it back), then the box
# goes down whatever failed. One module runs on the host's box only, so not here: the
# box's cloud (State=CLOUD nodes against moto, GPUCREDIT_BOX_CLOUD=1). The jobs API runs
# on each: the submitter on 22.05, the box's slurmrestd on 24.11 and 26.05.
HOST_BOX_ONLY := tests/slurm/test_slurm_cloud.py tests/slurm/test_slurm_staging.py
SLURM_VERSIONS ?= 24.11 26.05
SLURM_VERSION_MODULES := tests/slurm/test_slurm_versions.py tests/slurm/test_slurm_versions_e2e.py
.PHONY: test-slurm-versions
test-slurm-versions: venv  ## tests/slurm's box tests on each of SLURM_VERSIONS (as root; minutes each)
	@status=0; for v in $(SLURM_VERSIONS); do \
	  echo "== tests/slurm on Slurm $$v"; \
	  $(BIN)/python -m slurmbox up --slurm $$v >/dev/null || { status=1; continue; }; \
	  GPUCREDIT_E2E_SLURM=$$v GPUCREDIT_BOX_VERSIONS=$$v $(BIN)/python -m pytest -m slurm $(SLURM_VERSION_MODULES) \
	    || status=1; \
	  GPUCREDIT_E2E_SLURM=$$v $(BIN)/python -m pytest tests/slurm -m slurm \
	    $(addprefix --ignore=,$(SLURM_VERSION_MODULES) $(HOST_BOX_ONLY)) || status=1; \
	  $(BIN)/python -m slurmbox down --slurm $$v >/dev/null || status=1; \
	done; exit $$status
