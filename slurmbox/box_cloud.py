"""The box's cloud: one State=CLOUD node, `cloud1`, in partition `burst` (region
us-west-2, beside the always-on `cloud` partition's us-east-1), powered up and down by
Slurm through `gpucredit cloud resume|suspend|resume-fail`, against moto's EC2 server on
127.0.0.1 (the provider), and "booted" by `cloud_boot` (its slurmd started once its
instance has run BOOT_DELAY_SECONDS).

Opt-in while it is new: `GPUCREDIT_BOX_CLOUD=1 make slurm-up` (SlurmBox.cloud). Without
it the box is exactly as before; tests/slurm/test_slurm_cloud.py skips, saying so.

The cloud programs read CONFIG (the box's own [cloud] section, beside the box's
gpucredit.toml, which they do not need); the provider's credentials are moto's dummies,
in the daemons' environment as a site's would be in slurmctld's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from slurm_hooks.admin import slurmconf

CLOUD_NODES = ("cloud1",)
PARTITION = "burst"
MOTO_PORT = 5055
ENDPOINT = f"http://127.0.0.1:{MOTO_PORT}"
BOOT_DELAY_SECONDS = 2
SUSPEND_TIME_SECONDS = 15
RESUME_TIMEOUT_SECONDS = 60
PRICE_UCREDITS_PER_HOUR = 98_320_000  # p5.48xlarge, in the site's region
REGION = "us-west-2"  # cloud1's
REGION_PRICE_UCREDITS_PER_HOUR = 90_000_000  # p5.48xlarge there
CONFIG = Path("/etc/gpucredit/box-cloud.toml")
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}  # moto's: not secrets
# slurmctld gives its power-saving programs none of its environment: the shims name this file.
CREDENTIALS_FILE = Path("/etc/gpucredit/box-cloud-credentials")


def config_text(state_dir: Path) -> str:
    return f"""# The Slurm box's cloud (slurmbox/box_cloud.py writes it at every start)
[slurm]
cluster = "lab"
[cloud]
endpoint_url = "{ENDPOINT}"
region = "us-east-1"
image_id = "ami-12c6146b"
state_dir = "{state_dir}"
launch_attempts = 1
terminate_attempts = 3
terminate_backoff_seconds = 0.5
suspend_time_seconds = {SUSPEND_TIME_SECONDS}
resume_timeout_seconds = {RESUME_TIMEOUT_SECONDS}
[cloud.nodes]
"cloud1" = "h100"
[cloud.instance_types]
h100 = "p5.48xlarge"
[cloud.prices_ucredits_per_hour]
"p5.48xlarge" = {PRICE_UCREDITS_PER_HOUR}
[cloud.regions.{REGION}]
nodes = "cloud1"
[cloud.regions.{REGION}.prices_ucredits_per_hour]
"p5.48xlarge" = {REGION_PRICE_UCREDITS_PER_HOUR}
"""


def slurm_conf_lines(hook_dir: str, cpus: int) -> str:
    """Power saving for cloud1 only (the on-premise nodes never suspend), its node line
    (heavier than any on-premise node) and its partition, below the always-on `cloud`
    (PriorityTier 0 against 1): at equal tiers Slurm powered cloud1 up while node3 sat idle."""
    return (
        slurmconf.power_saving_lines(
            hook_dir, suspend_time_seconds=SUSPEND_TIME_SECONDS, resume_timeout_seconds=RESUME_TIMEOUT_SECONDS
        )
        + "SuspendExcNodes=node[1-3]\n"
        + "SlurmctldParameters=idle_on_node_suspend\n"
        + f"NodeName=cloud1 NodeHostname=localhost NodeAddr=127.0.0.1 Port=6848 CPUs={cpus} RealMemory=2000 "
        + "Gres=gpu:a100:2,gpu:h100:2 Weight=100 State=CLOUD\n"
        + f"PartitionName={PARTITION} Nodes=cloud1 PriorityTier=0 DefaultTime=01:00:00 MaxTime=1-00:00:00 "
        + 'State=UP TRESBillingWeights="CPU=1.0,GRES/gpu:a100=10.0,GRES/gpu:h100=20.0"\n'
    )


def write_shims(hook_dir: str, python: str) -> None:
    """The three power-saving shims, on CONFIG, as `gpucredit slurm install` writes them."""
    command = slurmconf.cloud_command(python)
    CREDENTIALS_FILE.parent.mkdir(parents=True, exist_ok=True)
    CREDENTIALS_FILE.write_text(
        "[default]\n" + "".join(f"{k.lower()} = {v}\n" for k, v in CREDENTIALS.items()), encoding="utf-8"
    )
    CREDENTIALS_FILE.chmod(0o600)
    environment = {"AWS_SHARED_CREDENTIALS_FILE": str(CREDENTIALS_FILE), "AWS_CONFIG_FILE": "/dev/null"}
    for act in slurmconf.CLOUD_PROGRAMS:
        path = Path(hook_dir) / slurmconf.cloud_shim_name(act)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(slurmconf.render_cloud_shim(act, command, str(CONFIG), environment))
        tmp.chmod(0o755)
        os.replace(tmp, path)


def boot_main(log_dir: Path, env: dict[str, str]) -> int:
    """`python -m slurmbox _cloud_boot`: cloud1's slurmd follows its instance at moto."""
    import tomllib
    from datetime import UTC, datetime

    from accounting_bridge.cloud.config import load_cloud_config
    from accounting_bridge.cloud.provider import Ec2Provider, ProviderError
    from slurmbox.cloud_boot import CloudBoot

    provider = Ec2Provider(load_cloud_config(tomllib.loads(CONFIG.read_text(encoding="utf-8"))))

    def utcnow() -> datetime:
        return datetime.now(UTC)

    def start(node: str) -> subprocess.Popen[bytes]:
        # slurmctld takes a powering-up node as up only once it reports a boot after the
        # resume request; on one host every slurmd reports the host's. A time namespace
        # whose boot clock starts now gives this one a boot of its own, as an instance has.
        uptime = int(float(Path("/proc/uptime").read_text().split()[0]))
        argv = ["/usr/bin/unshare", "--time", "--fork", "--kill-child=SIGTERM", f"--boottime=-{uptime - 1}"]
        with open(log_dir / f"slurmd-{node}.out", "ab") as out:
            proc = subprocess.Popen(
                [*argv, "/usr/sbin/slurmd", "-D", "-N", node],
                env=env,
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        print(f"started slurmd -N {node} (pid {proc.pid})", flush=True)
        return proc

    def stop(proc: subprocess.Popen[bytes]) -> None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        print(f"stopped slurmd pid {proc.pid}", flush=True)

    boot: CloudBoot[subprocess.Popen[bytes]] = CloudBoot(
        instances=provider.instances,
        start=start,
        stop=stop,
        clock=utcnow,
        boot_delay_seconds=BOOT_DELAY_SECONDS,
    )
    stopping = False

    def on_term(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    while not stopping:
        try:
            boot.tick()
        except ProviderError as error:  # moto starting or gone: try again
            print(f"provider: {error}", flush=True)
        for node, proc in list(boot.slurmd.items()):
            if proc.poll() is not None:  # a slurmd that died: the instance is still there
                print(f"slurmd -N {node} exited {proc.returncode}", flush=True)
                del boot.slurmd[node]
        time.sleep(0.5)
    for proc in boot.running().values():
        stop(proc)
    return 0


def provider_answers() -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{ENDPOINT}/moto-api/", timeout=2) as answer:
            return bool(answer.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def moto_argv() -> tuple[str, ...]:
    return (sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(MOTO_PORT))
