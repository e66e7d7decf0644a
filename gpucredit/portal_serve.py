"""`gpucredit serve`: the portal's own command (portal/cli.py), handed the cloud report's
inputs, which only the CLI root may reach from both sides.

The portal imports the ledger and slurmtext only; the instance journal, the instance
prices and the cloud nodes belong to accounting_bridge.cloud
(tests/architecture/test_boundaries.py). So the root, which may import both, gives the
app a source of them (`portal.admin.cloud.set_cloud_source`) when the configuration has
a `[cloud]` section it can read. Without one /admin/cloud says the journal is not
there, rather than showing an empty bill.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import click

from portal.cli import serve
from portal.cli import serve_command as portal_serve_command

if TYPE_CHECKING:
    from flask import Flask

__all__ = ["install_cloud_source", "serve_command"]

log = logging.getLogger("gpucredit.portal")


def install_cloud_source(app: Flask) -> bool:
    """Give /admin/cloud the journal's instances, read on each request; False (and a
    warning for a section it cannot read) when the site has no cloud to report."""
    from accounting_bridge.cloud.config import CloudConfigError, load_cloud_config
    from accounting_bridge.cloud.report import report_inputs
    from portal.admin.cloud import set_cloud_source

    config = app.config["GPUCREDIT"]
    if not config.get("cloud"):
        return False
    try:
        load_cloud_config(config)
    except CloudConfigError as error:
        log.warning("/admin/cloud has no report: %s", error)
        return False
    set_cloud_source(app, lambda: report_inputs(config))
    return True


def _serve(host: str | None, port: int | None, threads: int | None) -> None:
    serve(host, port, threads, prepare=install_cloud_source)


serve_command = click.Command(
    "serve",
    params=portal_serve_command.params,
    callback=_serve,
    help=portal_serve_command.help,
)
