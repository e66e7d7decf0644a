"""Slurm's associations kept in step with the ledger: who may charge an account, the
shares, the GPU limits. Slurm enforces them without asking gpucredit, so they hold while
the ledger is down (docs/fairshare.md, docs/limits-sync.md).

    associations    Slurm's accounts and users mirrored into the ledger (`account import-slurm`)
    fairshare       the shares formula, pure: credit and spend in, shares out
    fairshare_sync  the shares into Slurm (plan_changes, apply_plan); sshare read back
    limits_sync     the ledger's caps and blocks, and scarcity caps, as association GrpTRES
                    and partition QOS limits (read_slurm, plan_limits, apply_plan)
    scarcity        whether a partition's GPUs are scarce, pure, with hysteresis
    assoc_batch     sacctmgr: the one `show associations` command line, `modify` in batches
    slurm_check     `gpucredit slurm check [--sync]`: every difference, and its fix
    fairshare_cli   `gpucredit fairshare sync | show`
    limits_cli      `gpucredit limits sync`, `gpucredit limits show ACCOUNT [--slurm]`

An admin runs these commands; the daemon keeps the limits in step on its own
(gpucredit/daemon/limits_keeper.py).
"""
