"""`[cloud]`: read once, every bad value refused with its key named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from accounting_bridge.cloud.config import CloudConfigError, load_cloud_config
from tests.support.cloud import cloud_section


def load(**overrides: Any) -> Any:
    return load_cloud_config({"cloud": {**cloud_section("http://127.0.0.1:9", Path("/tmp/x")), **overrides}})


def test_a_whole_section_reads_into_one_config() -> None:
    config = load(nodes={"cloud[1-2]": "h100", "big01": "h100"})
    assert config.node_gpu_types == {"cloud1": "h100", "cloud2": "h100", "big01": "h100"}
    assert config.instance_type_of("cloud2") == "p5.48xlarge"
    assert config.price_of("p5.48xlarge") == 98_320_000
    assert config.price_of("g5.xlarge") is None
    assert (config.cluster, config.endpoint_url, config.state_dir) == (
        "lab",
        "http://127.0.0.1:9",
        Path("/tmp/x"),
    )
    assert (config.launch_attempts, config.terminate_attempts, config.terminate_backoff_seconds) == (
        1,
        4,
        1.0,
    )


def test_an_empty_endpoint_is_the_providers_own() -> None:
    assert load(endpoint_url="").endpoint_url is None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"prices_ucredits_per_hour": {"p5.48xlarge": 98.32}},
            "cloud.prices_ucredits_per_hour.p5.48xlarge: integer micro-credits an hour, got 98.32",
        ),
        (
            {"prices_ucredits_per_hour": {"p5.48xlarge": True}},
            "cloud.prices_ucredits_per_hour.p5.48xlarge: integer micro-credits an hour, got True",
        ),
        (
            {"prices_ucredits_per_hour": {}},
            "cloud.prices_ucredits_per_hour: no price for p5.48xlarge (cloud.instance_types.h100)",
        ),
        (
            {"nodes": {"cloud1": "v100"}},
            "cloud.nodes.cloud1: GPU type v100 has no cloud.instance_types entry",
        ),
        ({"nodes": {"cloud[1-2]": "h100", "cloud2": "h100"}}, "cloud.nodes: node cloud2 is in two hostlists"),
        ({"region": ""}, "cloud.region: required, a non-empty string (got '')"),
        ({"image_id": None}, "cloud.image_id: required, a non-empty string (got None)"),
        ({"terminate_attempts": 0}, "cloud.terminate_attempts: an integer from 1 to 20, got 0"),
        ({"launch_attempts": 2.0}, "cloud.launch_attempts: an integer from 1 to 20, got 2.0"),
        ({"terminate_backoff_seconds": 60}, "cloud.terminate_backoff_seconds: seconds from 0 to 30, got 60"),
        ({"tags": {"Project": 7}}, "cloud.tags.Project: a non-empty string, got 7"),
    ],
)
def test_a_bad_value_is_refused_with_its_key(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(CloudConfigError) as raised:
        load(**overrides)
    assert str(raised.value) == message


def test_a_node_in_no_hostlist_has_no_instance_type() -> None:
    with pytest.raises(CloudConfigError) as raised:
        load().instance_type_of("node1")
    assert str(raised.value) == "cloud.nodes: node node1 is in no hostlist (its GPU type)"


def test_regions_name_their_nodes_image_and_own_prices() -> None:
    config = load(
        regions={
            "us-west-2": {
                "nodes": "cloud2",
                "image_id": "ami-west",
                "prices_ucredits_per_hour": {"p5.48xlarge": 90},
            }
        }
    )
    assert config.regions == ("us-east-1", "us-west-2")
    assert (config.region_of("cloud1"), config.region_of("cloud2")) == ("us-east-1", "us-west-2")
    assert (config.image_of("us-east-1"), config.image_of("us-west-2")) == ("ami-12c6146b", "ami-west")
    assert (config.price_of("p5.48xlarge"), config.price_of("p5.48xlarge", "us-west-2")) == (98_320_000, 90)
    assert load(regions={"eu-west-1": {"nodes": "cloud1"}}).image_of("eu-west-1") == "ami-12c6146b"


@pytest.mark.parametrize(
    ("regions", "message"),
    [
        (
            {"us-west-2": {"nodes": "cloud9"}},
            "cloud.regions.us-west-2.nodes: node cloud9 is in no cloud.nodes hostlist",
        ),
        (
            {"us-west-2": {"nodes": "cloud1"}, "eu-west-1": {"nodes": "cloud[1-2]"}},
            "cloud.regions.eu-west-1.nodes: node cloud1 is in two regions",
        ),
        ({"us-east-1": {"nodes": "cloud1"}}, "cloud.regions.us-east-1: us-east-1 is cloud.region already"),
        ({"us-west-2": {"node": "cloud1"}}, "cloud.regions.us-west-2.node: not a setting"),
        ({"us-west-2": {}}, "cloud.regions.us-west-2.nodes: required"),
        (
            {"us-west-2": {"nodes": "cloud1", "prices_ucredits_per_hour": {"p5.48xlarge": 1.5}}},
            "cloud.regions.us-west-2.prices_ucredits_per_hour.p5.48xlarge: integer micro-credits",
        ),
    ],
)
def test_a_bad_region_table_is_refused_naming_the_key(regions: dict[str, Any], message: str) -> None:
    with pytest.raises(CloudConfigError, match=message.replace(".", r"\.").replace("[", r"\[")):
        load(regions=regions)
