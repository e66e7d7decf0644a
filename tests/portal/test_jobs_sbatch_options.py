"""sbatch's options, built once (portal.jobs.submitter.sbatch_options) for the argv the
submitter runs as root and for the line the New job page shows: the routing directives
go into one --comment word, and the submitter refuses a value job_submit would not read."""

from __future__ import annotations

import pwd

import pytest

from portal.jobs.submitter import CONTAINER_WORDS, BadRequest, sbatch_argv, sbatch_options

SPEC = {"account": "physics", "gpus": "h100:2", "time_limit": "02:00:00"}


def test_the_directives_share_one_comment_word() -> None:
    assert sbatch_options({**SPEC, "max_cost": "25", "cloud": "no"}) == [
        "-A",
        "physics",
        "--gres=gpu:h100:2",
        "-t",
        "02:00:00",
        "--comment=gpucredit:max_cost=25,cloud=no",
    ]
    assert sbatch_options({**SPEC, "cloud": "yes"})[-1] == "--comment=gpucredit:cloud=yes"
    with_region = sbatch_options({**SPEC, "cloud": "yes", "region": "us-west-2"})[-1]
    assert with_region == "--comment=gpucredit:cloud=yes,region=us-west-2"
    with pytest.raises(BadRequest):
        sbatch_options({**SPEC, "region": "us west"})
    assert not any(option.startswith("--comment") for option in sbatch_options(SPEC))


def test_the_argv_runs_the_same_options_as_the_user() -> None:
    user = pwd.struct_passwd(("bob", "x", 1001, 1001, "", "/home/bob", "/bin/bash"))
    argv = sbatch_argv({**SPEC, "cloud": "yes"}, user, sbatch="/usr/bin/sbatch")
    start = argv.index("/usr/bin/sbatch")
    assert argv[start:] == [
        "/usr/bin/sbatch",
        "--parsable",
        "--export=ALL",
        *sbatch_options({**SPEC, "cloud": "yes"}),
        "-D",
        "/home/bob",
    ]


@pytest.mark.parametrize("cloud", ["maybe", "yes,max_cost=0", "YES"])
def test_a_cloud_value_job_submit_would_not_read_is_refused(cloud: str) -> None:
    with pytest.raises(BadRequest) as refused:
        sbatch_options({**SPEC, "cloud": cloud})
    assert (refused.value.field, refused.value.message) == ("cloud", f"{cloud!r} is not accepted")


def test_a_container_is_sbatchs_own_option_and_must_be_absolute() -> None:
    assert sbatch_options({**SPEC, "container": "/srv/bundles/bob"})[-1] == "--container=/srv/bundles/bob"
    for bad in ("bundles/bob", "/srv/b\nundle", "/srv/\0", "/srv/bundle\n", "/srv/$(id)", "/srv/a b"):
        with pytest.raises(BadRequest) as refused:
            sbatch_options({**SPEC, "container": bad})
        assert (refused.value.field, refused.value.message) == ("container", CONTAINER_WORDS)
