#!/bin/sh
# gpucredit @hook@ hook, written by `gpucredit slurm install`.
# Slurm runs hooks with no PATH, so every path here is absolute.
# GPUCREDIT_HOOK_SETTINGS is a copy of the config's hook settings (daemon socket and
# timeout, policy, cluster, bin_dir, spool_dir, log_file) taken at install time, so
# that no hook parses TOML on every job. To change them, edit the config and then
# run `gpucredit slurm install` again (job_submit.lua needs that too). Without
# GPUCREDIT_HOOK_SETTINGS the hook reads GPUCREDIT_CONFIG on every run.
exec /usr/bin/env \
    GPUCREDIT_CONFIG=@config@ \
    GPUCREDIT_HOOK_SETTINGS=@settings@ \
    @exe@ hook @hook@
