"""Admin commands for the Slurm side (`gpucredit slurm config|install|check`): the
slurm.conf lines, the hook shims and job_submit.lua. Run by people, never by Slurm."""
