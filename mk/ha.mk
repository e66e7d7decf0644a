# The HA ledger database (slurmbox/ha.py): Patroni with etcd, a primary and a synchronous
# standby on loopback ports (PostgreSQL 15431, 15432; Patroni 18431, 18432; etcd 12379, 12380),
# apart from the system PostgreSQL on 5432.
# Run as root; needs Debian's patroni and etcd-server. Included by the Makefile.
# `make ha-up` writes the cluster's multi-host URL to var/ha/database.url and migrates it;
# point gpucredit at it: GPUCREDIT_DATABASE_URL=$$(cat var/ha/database.url) gpucredit ...
.PHONY: ha-up ha-failover ha-down ha-status

ha-up: venv  ## start the cluster, or the nodes of it that are down; wait for a leader and a synchronous standby
	$(BIN)/python -m slurmbox.ha up
	GPUCREDIT_DATABASE_URL="$$(cat var/ha/database.url)" $(BIN)/gpucredit init

ha-failover:  ## crash the leader (its Patroni, postmaster and backends stopped, then SIGKILLed) and wait for the standby to lead; prints the timings
	$(BIN)/python -m slurmbox.ha failover

ha-down:  ## stop etcd and both nodes (HA_WIPE=1: and remove var/ha)
	$(BIN)/python -m slurmbox.ha down $(if $(filter 1 yes true,$(HA_WIPE)),--wipe,)

ha-status:  ## JSON: the nodes' roles, the leader, the URL
	$(BIN)/python -m slurmbox.ha status
