"""Cloud nodes: Slurm's power saving launches and ends them through a provider's API.

    config     the `[cloud]` settings (CloudConfig): endpoint, region, image, the instance
               type of each node's GPU type, each type's price an hour in micro-credits, tags
    provider   the provider: Ec2Provider on boto3 (AWS EC2, or any endpoint that speaks
               its API: moto on the box), Instance, and the error tree
    journal    the instances this site launched and ended, append-only (JSON lines): the
               bill's record when the provider has long forgotten a terminated instance
    plan       pure decisions: each instance's cost so far, and which instances
               `reconcile` ends (plan_reconcile's docstring is the decision table)
    programs   Slurm's ResumeProgram, SuspendProgram and ResumeFailProgram, `reconcile`
    report     the monthly report's inputs (the journal's instances at their prices, the
               cloud nodes and partitions) for ledger.api.cloud_report, which computes it
    cli        `gpucredit cloud resume|suspend|resume-fail|instances|reconcile|report`

boto3 is the `cloud` extra: it is imported when a provider is made, never by the CLI's
root, so every other command runs without it. Money here is one figure: an instance's
cost, `ledger.api.charge_for` of its type's price over its seconds.
"""
