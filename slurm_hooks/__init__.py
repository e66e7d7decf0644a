"""Slurm's prolog/epilog entry points and slurm.conf wiring.

Hooks run inside slurmctld/slurmd with no PATH and a clock ticking on the job's
start, so `slurm_hooks.hooks` and `slurm_hooks.client` import the stdlib only.
"""
