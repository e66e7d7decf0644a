"""Read models: figures for people and for monitoring, computed from the books and the
holds without a lock. Nothing here moves money.

    reports          usage by day, GPU type, user, partition or account (usage_report)
    history          each run's hold beside Slurm's record and its entries (job_history,
                     job_record, hold_entries, charge_entries, running_totals)
    efficiency       how busy the GPUs a run was charged for were (add_gpu_usage,
                     efficiency_report)
    totals           every account's credit now, and who belongs where (account_totals,
                     memberships)
    fairness_inputs  what fairshare is computed from (fairness_inputs)
    enforcement      the GPU caps and blocks Slurm enforces on its own (enforcement)
    charge_counter   /metrics' running sums of charges (ChargeCounter)
    cloud_report     a month's cloud instance cost beside the credits charged to the jobs
                     on them, boot and idle as the site's overhead (cloud_report)
"""
