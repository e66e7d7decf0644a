"""The `[cloud]` section of gpucredit.toml, read and checked once.

    [cloud]
    endpoint_url = "http://127.0.0.1:5000"   # "" or absent: the provider's own (AWS)
    region = "us-east-1"
    image_id = "ami-0123456789abcdef0"       # what RunInstances boots
    user_data = "#!/bin/sh\nexec slurmd -N @node@\n"   # optional; @node@: the Slurm node name
    state_dir = "/var/lib/gpucredit/cloud"   # the journal of instances launched and ended
    launch_attempts = 2                      # API calls per launch (botocore's retries)
    terminate_attempts = 8                   # tries per termination, with backoff
    terminate_backoff_seconds = 1.0          # first wait; doubles, at most 30 s
    suspend_time_seconds = 600               # slurm.conf SuspendTime, ResumeTimeout: what
    resume_timeout_seconds = 900             #   `gpucredit slurm config` prints
    [cloud.nodes]                            # hostlist = GPU type of those Slurm nodes
    "cloud[1-4]" = "h100"
    [cloud.instance_types]                   # GPU type = the instance type launched for it
    h100 = "p5.48xlarge"
    [cloud.prices_ucredits_per_hour]         # instance type = its price an hour, integer
    "p5.48xlarge" = 98_320_000               #   micro-credits (98.32 credits)
    [cloud.tags]                             # added to every instance launched
    Project = "gpucredit"
    [cloud.regions."us-west-2"]              # nodes launched in another region than `region`
    nodes = "cloud[5-8]"                     # (each also in a [cloud.nodes] hostlist)
    image_id = "ami-0fedcba9876543210"       # AMIs are per region; default: cloud.image_id
    [cloud.regions."us-west-2".prices_ucredits_per_hour]   # optional: what differs there
    "p5.48xlarge" = 110_000_000

A bad value (a float price, an unknown GPU type, a node in two hostlists) raises
CloudConfigError naming the key: a misconfigured cloud never launches.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurmtext import SlurmTextError, expand_hostlist

__all__ = ["DEFAULT_STATE_DIR", "CloudConfig", "CloudConfigError", "load_cloud_config"]

DEFAULT_STATE_DIR = "/var/lib/gpucredit/cloud"
MAX_ATTEMPTS = 20  # a limit on every retry loop
MAX_BACKOFF_SECONDS = 30.0


class CloudConfigError(ValueError):
    """The `[cloud]` section cannot be used: its message names the key."""


@dataclass(frozen=True)
class CloudConfig:
    region: str
    image_id: str
    cluster: str  # slurm.cluster: tags this site's instances apart from any other's
    endpoint_url: str | None = None
    state_dir: Path = Path(DEFAULT_STATE_DIR)
    node_gpu_types: Mapping[str, str] = field(default_factory=dict)
    instance_types: Mapping[str, str] = field(default_factory=dict)
    prices_ucredits_per_hour: Mapping[str, int] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)
    launch_attempts: int = 2
    terminate_attempts: int = 8
    terminate_backoff_seconds: float = 1.0
    user_data: str | None = None  # @node@ stands for the node's name
    node_regions: Mapping[str, str] = field(default_factory=dict)  # nodes outside `region`
    region_images: Mapping[str, str] = field(default_factory=dict)  # region -> its image, if not image_id
    region_prices: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # region -> type -> price

    @property
    def regions(self) -> tuple[str, ...]:
        """Every region this site launches in: `region` first."""
        return (self.region, *sorted(set(self.node_regions.values()) - {self.region}))

    def region_of(self, node: str) -> str:
        return self.node_regions.get(node, self.region)

    def image_of(self, region: str) -> str:
        return self.region_images.get(region, self.image_id)

    def instance_type_of(self, node: str) -> str:
        """The instance type node `node` is launched as; CloudConfigError when none."""
        gpu_type = self.node_gpu_types.get(node)
        if gpu_type is None:
            raise CloudConfigError(f"cloud.nodes: node {node} is in no hostlist (its GPU type)")
        return self.instance_types[gpu_type]  # load_cloud_config checked each has one

    def price_of(self, instance_type: str, region: str | None = None) -> int | None:
        """Micro-credits an hour of `instance_type` in `region` (its own price there, else
        the site's), or None when this site has no price for it (an instance someone else
        launched as another type)."""
        own = self.region_prices.get(region or self.region, {})
        return own.get(instance_type, self.prices_ucredits_per_hour.get(instance_type))


def load_cloud_config(config: Mapping[str, Any]) -> CloudConfig:
    """The CloudConfig of a loaded gpucredit config (ledger.config.load_config)."""
    section = config.get("cloud") or {}
    if not isinstance(section, Mapping):
        raise CloudConfigError("cloud: must be a table")
    region = _text(section, "region")
    image_id = _text(section, "image_id")
    endpoint = section.get("endpoint_url") or None
    if endpoint is not None and not isinstance(endpoint, str):
        raise CloudConfigError(f"cloud.endpoint_url: a URL string, got {endpoint!r}")
    instance_types = _strings(section, "instance_types")
    prices = _prices(section)
    for gpu_type, instance_type in instance_types.items():
        if instance_type not in prices:
            raise CloudConfigError(
                f"cloud.prices_ucredits_per_hour: no price for {instance_type} "
                f"(cloud.instance_types.{gpu_type})"
            )
    node_gpu_types = _nodes(section, instance_types)
    node_regions, region_images, region_prices = _regions(section, region, node_gpu_types)
    return CloudConfig(
        region=region,
        image_id=image_id,
        cluster=str((config.get("slurm") or {}).get("cluster") or "lab"),
        endpoint_url=endpoint,
        state_dir=Path(str(section.get("state_dir") or DEFAULT_STATE_DIR)),
        node_gpu_types=node_gpu_types,
        instance_types=instance_types,
        prices_ucredits_per_hour=prices,
        tags=_strings(section, "tags"),
        launch_attempts=_attempts(section, "launch_attempts", 2),
        terminate_attempts=_attempts(section, "terminate_attempts", 8),
        terminate_backoff_seconds=_seconds(section, "terminate_backoff_seconds", 1.0),
        user_data=_optional_text(section, "user_data"),
        node_regions=node_regions,
        region_images=region_images,
        region_prices=region_prices,
    )


REGION_KEYS = frozenset({"nodes", "image_id", "prices_ucredits_per_hour"})


def _regions(
    section: Mapping[str, Any], default: str, node_gpu_types: Mapping[str, str]
) -> tuple[dict[str, str], dict[str, str], dict[str, dict[str, int]]]:
    """`[cloud.regions.NAME]`: which nodes launch there, its image, its own prices."""
    table = section.get("regions") or {}
    if not isinstance(table, Mapping):
        raise CloudConfigError("cloud.regions: must be a table")
    nodes: dict[str, str] = {}
    images: dict[str, str] = {}
    prices: dict[str, dict[str, int]] = {}
    for name, entry in table.items():
        key = f"regions.{name}"
        if name == default:
            raise CloudConfigError(f"cloud.{key}: {name} is cloud.region already (its nodes need no table)")
        if not isinstance(entry, Mapping):
            raise CloudConfigError(f"cloud.{key}: must be a table")
        unknown = sorted(set(entry) - REGION_KEYS)
        if unknown:
            raise CloudConfigError(
                f"cloud.{key}.{unknown[0]}: not a setting (known: {', '.join(sorted(REGION_KEYS))})"
            )
        try:
            names = expand_hostlist(_text(entry, "nodes", key))
        except SlurmTextError as error:
            raise CloudConfigError(f"cloud.{key}.nodes: {error}") from None
        for node in names:
            if node not in node_gpu_types:
                raise CloudConfigError(f"cloud.{key}.nodes: node {node} is in no cloud.nodes hostlist")
            if node in nodes:
                raise CloudConfigError(f"cloud.{key}.nodes: node {node} is in two regions")
            nodes[node] = name
        image = _optional_text(entry, "image_id", key)
        if image is not None:
            images[name] = image
        prices[name] = _prices(entry, key)
    return nodes, images, prices


def _text(section: Mapping[str, Any], key: str, table: str = "") -> str:
    value = section.get(key)
    if not isinstance(value, str) or not value:
        raise CloudConfigError(f"cloud.{_dotted(table, key)}: required, a non-empty string (got {value!r})")
    return value


def _optional_text(section: Mapping[str, Any], key: str, table: str = "") -> str | None:
    value = section.get(key)
    if value is not None and not isinstance(value, str):
        raise CloudConfigError(f"cloud.{_dotted(table, key)}: a string, got {value!r}")
    return value or None


def _dotted(table: str, key: str) -> str:
    return f"{table}.{key}" if table else key


def _strings(section: Mapping[str, Any], key: str) -> dict[str, str]:
    table = section.get(key) or {}
    if not isinstance(table, Mapping):
        raise CloudConfigError(f"cloud.{key}: must be a table")
    for name, value in table.items():
        if not isinstance(value, str) or not value:
            raise CloudConfigError(f"cloud.{key}.{name}: a non-empty string, got {value!r}")
    return dict(table)


def _prices(section: Mapping[str, Any], within: str = "") -> dict[str, int]:
    key = _dotted(within, "prices_ucredits_per_hour")
    table = section.get("prices_ucredits_per_hour") or {}
    if not isinstance(table, Mapping):
        raise CloudConfigError(f"cloud.{key}: must be a table")
    for name, value in table.items():
        # bool is an int in Python, a float is never money here: both are refused.
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise CloudConfigError(f"cloud.{key}.{name}: integer micro-credits an hour, got {value!r}")
    return dict(table)


def _nodes(section: Mapping[str, Any], instance_types: Mapping[str, str]) -> dict[str, str]:
    nodes: dict[str, str] = {}
    for hostlist, gpu_type in _strings(section, "nodes").items():
        if gpu_type not in instance_types:
            raise CloudConfigError(
                f"cloud.nodes.{hostlist}: GPU type {gpu_type} has no cloud.instance_types entry"
            )
        try:
            names = expand_hostlist(hostlist)
        except SlurmTextError as error:
            raise CloudConfigError(f"cloud.nodes: {error}") from None
        for name in names:
            if name in nodes:
                raise CloudConfigError(f"cloud.nodes: node {name} is in two hostlists")
            nodes[name] = gpu_type
    return nodes


def _attempts(section: Mapping[str, Any], key: str, default: int) -> int:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_ATTEMPTS:
        raise CloudConfigError(f"cloud.{key}: an integer from 1 to {MAX_ATTEMPTS}, got {value!r}")
    return value


def _seconds(section: Mapping[str, Any], key: str, default: float) -> float:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_BACKOFF_SECONDS:
        raise CloudConfigError(f"cloud.{key}: seconds from 0 to {MAX_BACKOFF_SECONDS:g}, got {value!r}")
    return float(value)
