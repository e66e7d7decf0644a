"""`gpucredit daemon`: the one resident process on the controller. It owns the ledger's
database connections and answers job_submit.lua and the hooks over a Unix socket.

What it runs, all composed in `server.Daemon` (docs/design.md §3.9; `gpucredit daemon` is
`Daemon(config).serve(socket)`), one thread each::

    thread            code                                  what it does
    socket loop       socket_loop                           reads requests, writes replies
      submit          job_submit.answer (with request,      job_submit.lua's quote: estimate,
                      pricing, route_answer); quote_memo    routing, refusal, from the snapshot
      hold, settle    group_commit, hook_service            the hooks' requests, applied in
                                                            batches, one transaction each
    snapshot          ledger.api.SnapshotKeeper             what a quote reads, every second
    release loop      server.release_loop                   credit-held jobs released when
                                                            credit arrives (squeue, scontrol)
    Slurm facts       slurm_facts                           partitions' GPU types (sinfo)
    limits keeper     limits_keeper                         Slurm's GPU limits in step with the
                                                            ledger (`limits_sync.in_daemon`)
    burst keeper      burst_keeper                          cloud partitions held back at submit
                                                            added once a job has waited
                                                            (`routing.burst_after_seconds`)
    outage keeper     outage_keeper                         the hooks' price sheet and the
                                                            spool read back (docs/outage.md)
    metrics           metrics                               /metrics on `daemon.metrics_port`
    agents            accounting_bridge.nvml.receiver       GPU nodes' samples, MUNGE-signed, on
                                                            `daemon.agent_listen` (a thread per
                                                            connection)

job_submit/ holds both sides of job_submit's protocol (the Lua script and the Python that
answers it), as the project was specified; the sync and the read-back the keepers run are
the bridge's (accounting_bridge/sync/, accounting_bridge/outage/), which admins also run
by hand, and so is the agents' receiver (accounting_bridge/nvml/). Hook processes never
import this package (they are stdlib clients, `slurm_hooks`), so SQLAlchemy never reaches
a prolog; tests/architecture/test_runtimes.py keeps it so.
"""

from gpucredit.daemon.server import Daemon

__all__ = ["Daemon"]
