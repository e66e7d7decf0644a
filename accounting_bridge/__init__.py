"""Slurm accounting <-> ledger: the processes that read what Slurm did, charge it, and keep
Slurm's own limits in step with the ledger. One sub-package per process or external system::

    slurm/          Slurm's commands and job records: the one command runner (slurmcmd), the
                    sacct and squeue parsers (records), where runs come from (backends)
    sacct/          `gpucredit bridge sacct | reconcile`: finished runs charged exactly
                    (ingest; reconcile, whose plan_run is the decision table, docs/design.md §9)
    meter/          `gpucredit bridge meter`: running jobs' cost so far, leases renewed
    nvml/           `gpucredit agent`: GPU usage sampled through NVML on each node
    sync/           Slurm's associations kept in step: accounts (`account import-slurm`),
                    fairshare, GPU limits and blocks, scarcity caps, `slurm check`
    outage/         the hooks' outage spool read back into the ledger; `gpucredit policy`
    cli.py          the `bridge` group (sacct, reconcile, meter)
    cli_support.py  what the bridge's commands share (injected runner and clock)

slurm/ imports no other sub-package; every other one imports slurm/ at most, never a
sibling (tests/architecture/test_boundaries.py). Money moves through the ledger's public modules only.
The daemon runs two of these on its own: the limits sync and the outage read-back
(gpucredit/daemon/).
"""
