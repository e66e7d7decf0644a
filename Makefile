# gpucredit: `make demo` runs the main job on embedded SQLite; `make test` runs every test.
# The interpreter the admin guide installs with: the distribution's python3 where it is
# 3.11+ and can make venvs (Debian's is a static, profile-optimised build: the daemon's
# quote ran ~25% faster on it than on pyenv's --enable-shared one), else python3 on PATH.
PYTHON ?= $(or $(shell for p in /usr/bin/python3 python3; do \
	$$p -c 'import sys, ensurepip, venv; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
	&& { echo $$p; break; }; done),python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-dev
DEMO_DB ?= $(CURDIR)/var/demo.db

.PHONY: venv demo demo-no-serve test check lint typecheck bench clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# `make demo` ends serving the portal on the demo data (Ctrl-C stops it);
# `make demo-no-serve` (or DEMO_SERVE=0) only prints, for scripts.
DEMO_SERVE ?= 1
demo: venv
	rm -f $(DEMO_DB) $(DEMO_DB)-wal $(DEMO_DB)-shm
	GPUCREDIT_DATABASE_URL=sqlite:///$(DEMO_DB) $(BIN)/python -m gpucredit.demo \
	  $(if $(filter 0 no false,$(DEMO_SERVE)),--no-serve,--serve)

demo-no-serve:
	$(MAKE) demo DEMO_SERVE=0

# The product: the packages the wheel carries (setup.cfg [options.packages.find]); the
# format check and the type check cover every one of them.
PRODUCT   := ledger gpucredit portal accounting_bridge slurm_hooks job_submit slurmtext

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check $(PRODUCT)

typecheck: venv
	$(BIN)/mypy $(PRODUCT)

# Every test, in two lanes at once: the Slurm box suite (tests marked slurm, which spend
# their time waiting on Slurm) in the foreground, and every other test beside it, niced,
# its output kept in var/test-rest.log and printed after. Either failing fails the target.
test: venv lint typecheck
	@mkdir -p var; \
	nice -n 10 $(BIN)/python -m pytest -m "not slurm" -p no:cacheprovider >var/test-rest.log 2>&1 & rest=$$!; \
	$(BIN)/python -m pytest -m slurm -p no:cacheprovider; box=$$?; \
	wait $$rest; others=$$?; \
	echo "== every test but the box's (var/test-rest.log)"; cat var/test-rest.log; \
	echo "== box suite: exit $$box; the rest: exit $$others"; \
	[ $$box -eq 0 ] && [ $$others -eq 0 ]

# Each bench ends with its rows of the performance table, one `goal  ...` line per
# figure (bench/goals.py): `make bench 2>&1 | grep '^goal '` is the table. The hooks'
# bench needs root and the Slurm box (`make slurm-up`); BENCH_SLURM=0 skips it.
BENCH_SLURM ?= 1
# The chroot boxes bench.slurm_versions measures too (their roots: python -m slurmbox rootfs).
BENCH_SLURM_VERSIONS ?= 24.11 26.05
# The failover bench needs root and the HA box's packages (patroni, etcd-server): BENCH_HA=1.
BENCH_HA ?= 0
# The cloud burst bench needs the box's cloud (GPUCREDIT_BOX_CLOUD=1 make slurm-up): BENCH_CLOUD=1.
BENCH_CLOUD ?= 0
bench: venv
	$(BIN)/python -m bench.ledger_throughput
	$(BIN)/python -m bench.meter_tick --holds 20000,50000 --workers 1
	$(BIN)/python -m bench.bridge --runs 100000
	$(BIN)/python -m bench.balance
	$(BIN)/python -m bench.pool_cycles
	$(BIN)/python -m bench.stage_in
	$(if $(filter 0 no false,$(BENCH_SLURM)),,$(MAKE) slurm-up && flock /tmp/slurmbox.lock $(BIN)/python -m bench.slurm_hooks)
	$(if $(filter 0 no false,$(BENCH_SLURM)),,flock /tmp/slurmbox.lock $(BIN)/python -m bench.jobs_api)
	$(if $(filter 1 yes true,$(BENCH_CLOUD)),flock /tmp/slurmbox.lock $(BIN)/python -m bench.cloud_burst,)
	$(if $(filter 0 no false,$(BENCH_SLURM))$(if $(BENCH_SLURM_VERSIONS),,none),,flock /tmp/slurmbox.lock $(BIN)/python -m bench.slurm_versions --slurm $(BENCH_SLURM_VERSIONS))
	$(BIN)/python -m bench.portal_load
	$(BIN)/python -m bench.portal_logins
	$(if $(filter 1 yes true,$(BENCH_HA)),$(BIN)/python -m bench.ha_failover,)

clean:
	rm -rf $(VENV) var build *.egg-info

-include mk/slurm.mk
-include mk/ha.mk
