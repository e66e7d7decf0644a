"""What the hooks admitted while the ledger was down, charged once it is back (docs/outage.md).

    readback  refresh_sheet (the prices the hooks estimate with while the ledger is down),
              read_back (each spooled run that ended, charged once, as unreserved)
    cli       `gpucredit policy bound | spool | readback`: what an outage can cost, the
              spool, and a read-back by hand

The spool is the hooks' (slurm_hooks/outage_spool.py); the daemon reads it back on its own
(gpucredit/daemon/outage_keeper.py).
"""
