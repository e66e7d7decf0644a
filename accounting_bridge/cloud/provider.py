"""The provider: EC2's API through boto3, the one module that calls it.

The endpoint is configuration (`cloud.endpoint_url`): AWS itself, or anything that
answers its API (moto's server on the box, a fault proxy in front of it in the tests);
the code path is the same. Credentials come from boto3's own chain (environment,
~/.aws/credentials, an instance role), never from gpucredit.toml.

Every instance this site launches carries three tags: `Name` and `gpucredit:node` (the
Slurm node it is) and `gpucredit:cluster` (slurm.cluster), so `instances()` lists this
cluster's and nobody else's.

Errors::

    ProviderError             the API refused or failed a call: .code is the provider's
    │                         (InsufficientInstanceCapacity, RequestLimitExceeded,
    │                         InternalError, ...), .retryable says whether trying again
    │                         may help (throttling, 5xx, capacity)
    └── ProviderUnreachable   no answer at all (refused, reset, timed out): retryable
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from accounting_bridge.cloud.config import MAX_BACKOFF_SECONDS, CloudConfig

__all__ = [
    "CLUSTER_TAG",
    "LIVE_STATES",
    "NODE_TAG",
    "Ec2Provider",
    "Instance",
    "ProviderError",
    "ProviderUnreachable",
    "retrying",
]

NODE_TAG = "gpucredit:node"
CLUSTER_TAG = "gpucredit:cluster"
# States in which the provider runs (and bills) an instance, or soon will.
LIVE_STATES = frozenset({"pending", "running", "stopping", "stopped"})
# Error codes worth another try; any 5xx too.
RETRYABLE_CODES = frozenset(
    {
        "RequestLimitExceeded",
        "Throttling",
        "ThrottlingException",
        "InternalError",
        "InternalFailure",
        "ServiceUnavailable",
        "Unavailable",
        "InsufficientInstanceCapacity",
    }
)
CONNECT_TIMEOUT_SECONDS = 5.0
READ_TIMEOUT_SECONDS = 30.0
PAGE_SIZE = 500
# AWS and moto: "User initiated (2026-12-03 19:49:29 GMT)" (moto says UTC).
_TRANSITION_TIME = re.compile(r"\((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (?:GMT|UTC)\)")

T = TypeVar("T")


class ProviderError(Exception):
    def __init__(self, code: str, message: str, *, retryable: bool) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.retryable = retryable


class ProviderUnreachable(ProviderError):
    def __init__(self, message: str) -> None:
        super().__init__("unreachable", message, retryable=True)


@dataclass(frozen=True)
class Instance:
    id: str
    node: str | None  # its gpucredit:node tag; None: untagged (not launched by us)
    instance_type: str
    region: str
    state: str  # pending | running | shutting-down | terminated | stopping | stopped
    launched_at: datetime
    state_changed_at: datetime | None = None  # when the provider says it stopped or ended

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES


class Ec2Provider:
    """EC2 in the config's regions (a node's instance lives in its node's region). A
    client per region is made when first needed (no I/O here)."""

    def __init__(self, config: CloudConfig) -> None:
        self.config = config
        # by region and attempts per call (botocore retries inside one)
        self._clients: dict[tuple[str, int], Any] = {}

    def _ec2(self, region: str, attempts: int) -> Any:
        import boto3
        from botocore.config import Config

        if (region, attempts) in self._clients:
            return self._clients[region, attempts]
        self._clients[region, attempts] = boto3.client(
            "ec2",
            region_name=region,
            endpoint_url=self.config.endpoint_url,
            config=Config(
                retries={"total_max_attempts": attempts, "mode": "standard"},
                connect_timeout=CONNECT_TIMEOUT_SECONDS,
                read_timeout=READ_TIMEOUT_SECONDS,
            ),
        )
        return self._clients[region, attempts]

    def _call(self, operation: str, region: str, attempts: int = 1, **params: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        client = self._ec2(region, attempts)
        try:
            return getattr(client, operation)(**params)
        except ClientError as error:
            detail = error.response.get("Error", {})
            status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
            code = str(detail.get("Code") or f"HTTP{status}")
            retryable = code in RETRYABLE_CODES or status >= 500
            raise ProviderError(code, str(detail.get("Message") or error), retryable=retryable) from None
        except NoCredentialsError as error:
            raise ProviderError("no_credentials", str(error), retryable=False) from None
        except BotoCoreError as error:  # connection refused, reset, timed out
            raise ProviderUnreachable(str(error)) from None

    def launch(self, node: str) -> Instance:
        """RunInstances of one instance for Slurm node `node` in its region, tagged with
        its name.

        Its ClientToken makes botocore's own retries of this one call idempotent: a
        launch answered late is not launched twice."""
        tags = {**self.config.tags, "Name": node, NODE_TAG: node, CLUSTER_TAG: self.config.cluster}
        extra: dict[str, Any] = {}
        if self.config.user_data:  # the image's boot script: which node to be (boto3 base64s it)
            extra["UserData"] = self.config.user_data.replace("@node@", node)
        region = self.config.region_of(node)
        answer = self._call(
            "run_instances",
            region,
            attempts=self.config.launch_attempts,
            **extra,
            ImageId=self.config.image_of(region),
            InstanceType=self.config.instance_type_of(node),
            MinCount=1,
            MaxCount=1,
            ClientToken=f"gpucredit-{node}-{uuid.uuid4().hex}"[:64],
            TagSpecifications=[
                {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
            ],
        )
        return self._instance(answer["Instances"][0], region)

    def terminate(self, instances: Sequence[Instance]) -> None:
        """TerminateInstances, one call per region (no retry: see `retrying`)."""
        for region in sorted({i.region for i in instances}):
            ids = [i.id for i in instances if i.region == region]
            self._call("terminate_instances", region, InstanceIds=ids)

    def instances(self, nodes: Iterable[str] | None = None) -> list[Instance]:
        """This cluster's instances the provider still lists (terminated ones for a while),
        in every region of the config, or only those of `nodes` (in their regions)."""
        filters = [{"Name": f"tag:{CLUSTER_TAG}", "Values": [self.config.cluster]}]
        regions = self.config.regions
        if nodes is not None:
            names = sorted(set(nodes))
            filters.append({"Name": f"tag:{NODE_TAG}", "Values": names})
            regions = tuple(r for r in regions if r in {self.config.region_of(n) for n in names})
        found: list[Instance] = []
        for region in regions:
            token: str | None = None
            while True:
                params: dict[str, Any] = {"Filters": filters, "MaxResults": PAGE_SIZE}
                if token:
                    params["NextToken"] = token
                answer = self._call("describe_instances", region, **params)
                for reservation in answer.get("Reservations", []):
                    found.extend(self._instance(item, region) for item in reservation.get("Instances", []))
                token = answer.get("NextToken")
                if not token:
                    break
        return sorted(found, key=lambda i: (i.launched_at, i.node or "", i.id))

    def _instance(self, item: dict[str, Any], region: str) -> Instance:
        tags = {tag["Key"]: tag["Value"] for tag in item.get("Tags", [])}
        launched = item["LaunchTime"]
        changed = _TRANSITION_TIME.search(item.get("StateTransitionReason") or "")
        return Instance(
            id=item["InstanceId"],
            node=tags.get(NODE_TAG),
            instance_type=item["InstanceType"],
            region=region,
            state=item["State"]["Name"],
            launched_at=launched.astimezone(UTC) if launched.tzinfo else launched.replace(tzinfo=UTC),
            state_changed_at=(
                datetime.strptime(changed.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
                if changed
                else None
            ),
        )


def retrying(
    call: Callable[[], T],
    *,
    attempts: int,
    backoff_seconds: float,
    sleep: Callable[[float], None],
    on_retry: Callable[[int, ProviderError, float], None] | None = None,
) -> T:
    """`call()`, tried up to `attempts` times while it raises a retryable ProviderError,
    waiting `backoff_seconds`, then twice that, ... (at most MAX_BACKOFF_SECONDS)
    between tries. The last error, or the first that is not retryable, is raised."""
    wait = backoff_seconds
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except ProviderError as error:
            if not error.retryable or attempt == attempts:
                raise
            if on_retry is not None:
                on_retry(attempt, error, wait)
            sleep(wait)
            wait = min(wait * 2, MAX_BACKOFF_SECONDS)
    raise AssertionError("unreachable: attempts >= 1")  # pragma: no cover
