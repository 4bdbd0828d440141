"""Nodes on one machine for the multi-node tests: network namespaces joined by a veth pair.

:class:`Nodes` makes two "nodes" (``ip netns``), each with its own address and ports, and
with ``hostnames=True`` its own host name too (a UTS namespace per process, and an
``/etc/hosts`` naming both nodes mounted over the machine's), so that what resolves a
host name (Slurm, torchrun's rendezvous, gloo) works as it does on real machines.
:class:`SlurmCluster` runs a real Slurm cluster on them: munged, slurmctld on node 0 and
one slurmd per node. Everything is made by the test and removed after it, pass or fail;
both need root and iproute2 (Slurm: Debian's slurmctld, slurmd, slurm-client and munge).

Example (as root):
    >>> with Nodes(hostnames=True) as nodes:  # doctest: +SKIP
    ...     nodes.run(0, ["hostname"]).stdout
    'vn1a2b30\\n'
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from vime.buffer import DataBuffer

ROOT = Path(__file__).resolve().parents[2]
NETNS_ETC = Path("/etc/netns")  # a namespace's own /etc files (``ip netns exec`` convention)
SLURM_TOOLS = ("slurmctld", "slurmd", "sbatch", "sinfo", "munged")


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=False)


def _check(out: subprocess.CompletedProcess[str]) -> None:
    if out.returncode != 0:
        raise RuntimeError(f"{out.args} failed: {out.stderr.strip()}")


def can_make_namespaces() -> bool:
    """Whether this process may make network namespaces (root and iproute2)."""
    if shutil.which("ip") is None or os.geteuid() != 0:
        return False
    probe = f"vime-probe-{uuid.uuid4().hex[:6]}"
    ok = _ip("netns", "add", probe).returncode == 0
    _ip("netns", "del", probe)
    return ok


def has_slurm() -> bool:
    """Whether Slurm's daemons, its client and munge are installed."""
    return all(shutil.which(tool) for tool in SLURM_TOOLS)


class Nodes:
    """Two namespaces ``vime-<tag>-n0/1`` on 10.213.<k>.1 / .2, linked by veth; with
    ``hostnames``, node i is also the host ``vn<tag>i`` (in both nodes' /etc/hosts)."""

    def __init__(self, *, hostnames: bool = False) -> None:
        tag = uuid.uuid4().hex[:5]
        self.names = [f"vime-{tag}-n0", f"vime-{tag}-n1"]
        self.links = [f"vm{tag}a", f"vm{tag}b"]
        k = int(tag, 16) % 200 + 20
        self.addrs = [f"10.213.{k}.1", f"10.213.{k}.2"]
        self.hostnames = [f"vn{tag}0", f"vn{tag}1"] if hostnames else []

    def __enter__(self) -> Nodes:
        try:
            self.create()
        except BaseException:
            self.destroy()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def create(self) -> None:
        for ns in self.names:
            _check(_ip("netns", "add", ns))
        _check(_ip("link", "add", self.links[0], "type", "veth", "peer", "name", self.links[1]))
        for ns, link, addr in zip(self.names, self.links, self.addrs, strict=True):
            _check(_ip("link", "set", link, "netns", ns))
            _check(_ip("-n", ns, "addr", "add", f"{addr}/24", "dev", link))
            _check(_ip("-n", ns, "link", "set", link, "up"))
            _check(_ip("-n", ns, "link", "set", "lo", "up"))
        if self.hostnames:
            hosts = "127.0.0.1 localhost\n" + "".join(
                f"{addr} {name}\n" for addr, name in zip(self.addrs, self.hostnames, strict=True)
            )
            for ns in self.names:
                (NETNS_ETC / ns).mkdir(parents=True, exist_ok=True)
                (NETNS_ETC / ns / "hosts").write_text(hosts)

    def destroy(self) -> None:
        for ns in self.names:
            for pid in _ip("netns", "pids", ns).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            _ip("netns", "del", ns)  # the veth pair goes with its namespaces
            shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)

    def pids(self) -> list[list[str]]:
        """The processes left in each namespace."""
        return [_ip("netns", "pids", ns).stdout.split() for ns in self.names]

    def command(self, node: int, args: list[str]) -> list[str]:
        """``args`` as run on ``node``: in its namespace, under its host name if it has one."""
        if not self.hostnames:
            return ["ip", "netns", "exec", self.names[node], *args]
        # Its own host name (a UTS namespace) and /etc/hosts (a mount namespace). Not `ip
        # netns exec`: it remounts /sys, and slurmd needs the cgroup mounts under it.
        hosts = NETNS_ETC / self.names[node] / "hosts"
        script = (
            f"hostname {self.hostnames[node]} && mount --bind {hosts} /etc/hosts && "
            f'exec nsenter --net=/run/netns/{self.names[node]} -- "$@"'
        )
        return ["unshare", "--uts", "--mount", "sh", "-c", script, "sh", *args]

    def spawn(
        self, node: int, args: list[str], log: Path, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start ``args`` on ``node`` in the background, its output in ``log``."""
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
        if not self.hostnames:
            # gloo picks its interface from the host name, which the namespaces share.
            env["GLOO_SOCKET_IFNAME"] = self.links[node]
        return subprocess.Popen(
            self.command(node, args),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )

    def run(
        self, node: int, args: list[str], env: dict[str, str] | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run ``args`` on ``node`` to the end."""
        return subprocess.run(
            self.command(node, args),
            env={**os.environ, **(env or {})},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=ROOT,
        )


class SlurmCluster:
    """A two-node Slurm cluster on ``nodes`` (which have host names): munged, slurmctld on
    node 0, a slurmd on each node; :meth:`sbatch` submits from node 0 and waits."""

    def __init__(self, nodes: Nodes, folder: Path) -> None:
        assert nodes.hostnames, "Slurm finds its nodes by host name"
        self.nodes, self.folder = nodes, folder
        self.conf = folder / "slurm.conf"
        # Unix sockets live here: a path has at most 108 bytes, and slurmstepd's own, under
        # the spool folder, did not fit under a pytest-xdist worker's tmp_path (slurmd then
        # logs "slurmstepd failed to send return code ... Resource temporarily unavailable").
        self.sockets = Path(tempfile.mkdtemp(prefix="vslurm-"))
        self.socket = self.sockets / "munge" / "munge.socket"
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def env(self) -> dict[str, str]:
        """What a Slurm command needs to find this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def __enter__(self) -> SlurmCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._start_munge()
        self._write_conf()
        state = self.folder / "state"
        state.mkdir()
        self.procs.append(
            self.nodes.spawn(
                0,
                ["slurmctld", "-D", "-c", "-f", str(self.conf)],
                self.folder / "slurmctld.out",
                self.env,
            )
        )
        for node, name in enumerate(self.nodes.hostnames):
            (self.sockets / name).mkdir()
            self.procs.append(
                self.nodes.spawn(
                    node,
                    ["slurmd", "-D", "-N", name, "-f", str(self.conf)],
                    self.folder / f"slurmd-{name}.out",
                    self.env,
                )
            )
        self._wait_for_idle_nodes(timeout=60)

    def _start_munge(self) -> None:
        munge = self.socket.parent
        munge.mkdir(mode=0o700)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        out = subprocess.run(
            [
                "munged",
                f"--socket={self.socket}",
                f"--key-file={key}",
                f"--pid-file={munge / 'munged.pid'}",
                f"--log-file={munge / 'munged.log'}",
                f"--seed-file={munge / 'munged.seed'}",
                "--force",  # as root
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=30,
        )
        if out.returncode != 0:
            raise RuntimeError(f"munged failed: {out.stderr.strip()}")

    def _write_conf(self) -> None:
        folder, nodes = self.folder, self.nodes
        cpus = os.cpu_count() or 1
        lines = [
            "ClusterName=vime",
            f"SlurmctldHost={nodes.hostnames[0]}({nodes.addrs[0]})",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.socket}",
            f"StateSaveLocation={folder / 'state'}",
            f"SlurmdSpoolDir={self.sockets / '%n'}",
            f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
            f"SlurmdPidFile={folder / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={folder / 'slurmctld.log'}",
            f"SlurmdLogFile={folder / 'slurmd-%n.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SelectType=select/linear",
            "SchedulerType=sched/builtin",
            "ReturnToService=2",
            # Two vLLM engines and two trainer ranks share this machine's cores: a busy
            # slurmd answers late, and the default 10 s would count it as down.
            "MessageTimeout=60",
            *(
                f"NodeName={name} NodeAddr={addr} CPUs={cpus} State=UNKNOWN"
                for name, addr in zip(nodes.hostnames, nodes.addrs, strict=True)
            ),
            "PartitionName=vime Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    def _wait_for_idle_nodes(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                break
            out = self.nodes.run(0, ["sinfo", "-h", "-N", "-o", "%N %t"], self.env)
            state = out.stdout + out.stderr
            if out.returncode == 0 and state.count(" idle") == len(self.nodes.hostnames):
                return
            time.sleep(0.5)
        raise RuntimeError(f"the Slurm nodes did not come up ({state.strip()}):\n{self.logs()}")

    def sbatch(
        self, script: Path, output: Path, env: dict[str, str], timeout: float
    ) -> subprocess.CompletedProcess[str]:
        """Submit ``script`` from node 0 with ``env`` (sbatch hands the job its environment)
        and wait for the job; its exit code is returned."""
        args = ["sbatch", "--wait", "--no-requeue", f"--chdir={ROOT}", f"--output={output}"]
        return self.nodes.run(0, [*args, str(script)], {**env, **self.env}, timeout=timeout)

    def logs(self) -> str:
        """The end of every daemon's log, for a failure's message."""
        parts = []
        for log in sorted(self.folder.glob("*.log")) + sorted(self.folder.glob("*.out")):
            parts.append(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        pid_file = self.socket.parent / "munged.pid"
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text().split()[0]), signal.SIGTERM)
            except (ProcessLookupError, ValueError):
                pass
        shutil.rmtree(self.sockets, ignore_errors=True)


def check_run_on_both(run_root: Path, nodes: Nodes, steps: int) -> None:
    """The one run under ``run_root`` trained ``steps`` steps on both nodes' engines."""
    runs = list(run_root.iterdir())
    assert len(runs) == 1, "rank 0 alone writes the run folder"
    rows = [json.loads(line) for line in (runs[0] / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if r.get("step", 0) >= 1]
    assert [r["step"] for r in trained] == list(range(1, steps + 1))
    assert trained[-1]["weight_version"] == steps  # both engines report it (the oldest counts)
    for row in trained:  # every step trained (filter_groups=false)
        # float32 on both engines and both trainer ranks: the gap stays at rounding level.
        assert row["train/train_rollout_logprob_abs_diff"] <= 1e-6, row
    buffer = DataBuffer(runs[0], readonly=True)
    episodes = [ep for step in buffer.steps() for ep in buffer.read_step(step)]
    servers = {ep.metadata["server"].split("//")[1].split(":")[0] for ep in episodes}
    assert servers == set(nodes.addrs), f"episodes ran on {servers}, not on both nodes' engines"


# What a multi-node docs block's training run gets appended: 3 steps of the topology, not
# of learning (no warm start: minutes of SFT), every group trained, rewards or not.
SHORT_STEPS = 3


def short_overrides(run_root: Path) -> list[str]:
    """The overrides a multi-node block's ``vime.cli train`` runs with (after its own)."""
    return [
        f"steps={SHORT_STEPS}",
        "rollout.batch_size=8",
        "model.warm_start_steps=0",
        "rollout.filter_groups=false",
        "eval_every=0",
        f"run_root={run_root}",  # after the block's own: the last one counts
    ]
