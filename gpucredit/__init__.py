"""The composition root: one `gpucredit` CLI and daemon assembled from the packages."""
