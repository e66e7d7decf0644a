#!/bin/sh
# gpucredit @hook@ hook, written by `gpucredit slurm install`.
# Slurm runs hooks with no PATH, so every path here is absolute.
exec /usr/bin/env GPUCREDIT_CONFIG=@config@ @exe@ hook @hook@
