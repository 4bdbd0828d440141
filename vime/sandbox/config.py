"""``SandboxConfig``: every knob of a Docker sandbox, with safe defaults.

Each field says what relaxing it risks. The defaults contain an agent that runs
arbitrary code: no network, no capabilities, a non-root user, memory / pids / CPU
limits, a read-only root filesystem, and a size-capped workspace.

Example:
    >>> cfg = SandboxConfig(memory="1g", network=False)
    >>> cfg.memory_bytes
    1073741824
"""

from __future__ import annotations

import os
import re
import socket
import time
from dataclasses import dataclass, field

from vime.config import require

_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}

# One id per process unless the caller names the run: containers are labelled with it,
# so `vime-agent sandbox gc` can tell which run left them behind.
DEFAULT_RUN_ID = (
    os.environ.get("VIME_RUN_ID") or f"{socket.gethostname()}-{os.getpid()}-{int(time.time())}"
)

# The labels vime puts on the containers it makes: `vime-agent sandbox gc` and the removal
# retry (vime.sandbox.removal) find them by these.
LABEL_SANDBOX = "vime.sandbox"  # "1" on every one
LABEL_RUN = "vime.run"  # the run id (SandboxConfig.effective_run_id)
# The process that made it, and that process's machine: gc removes a container of this
# machine whose process is dead.
LABEL_PID = "vime.pid"
LABEL_HOSTNAME = "vime.hostname"
LABEL_ROLE = "vime.role"  # "build" on the container that builds an image layer


def owner_labels() -> dict[str, str]:
    """This process's :data:`LABEL_PID` and :data:`LABEL_HOSTNAME` labels.

    Example:
        >>> owner_labels()[LABEL_PID] == str(os.getpid())
        True
    """
    return {LABEL_PID: str(os.getpid()), LABEL_HOSTNAME: socket.gethostname()}


def parse_size(text: str) -> int:
    """Bytes in a docker-style size string ("512m", "1g", "65536").

    Example:
        >>> parse_size("512m")
        536870912
    """
    found = re.fullmatch(r"\s*(\d+)\s*([bkmg]?)b?\s*", text.lower())
    if not found:
        raise ValueError(f"not a size: {text!r} (use e.g. '512m' or '1g')")
    return int(found.group(1)) * _UNITS[found.group(2)]


@dataclass
class SandboxConfig:
    """How sandboxes are created and how commands in them are limited.

    Example:
        >>> SandboxConfig(pids_limit=64).pids_limit
        64
    """

    # Image to run; "" means the offline base image (vime/base:<hash>), built on demand.
    image: str = ""
    # Memory limit (swap included, so it is a hard cap). Raising it lets one sandbox take
    # RAM from the others and from the trainer; the workspace tmpfs counts against it too.
    memory: str = "512m"
    # Max processes+threads. Raising it lets a fork bomb or thread storm slow the host;
    # -1 (unlimited) lets one sandbox exhaust the host's pid space.
    pids_limit: int = 256
    # CPU share in cores. More lets one busy sandbox starve its neighbours and vLLM.
    cpus: float = 1.0
    # Outbound network. On, agent code can download code, exfiltrate data, or attack
    # hosts reachable from this machine (including the docker host's own services).
    network: bool = False
    # User commands run as (uid:gid). "0:0" (root) makes every kernel bug and every
    # writable root-owned path an escape route; keep it non-root.
    user: str = "1000:1000"
    # Read-only root filesystem. Off, code can rewrite the image's binaries (poisoning
    # later episodes in a reused container) and write without bound to the host's disk:
    # overlay on ext4 has no per-container quota, only `max_file_mb` per file then.
    read_only: bool = True
    # Writable, size-capped working folder (a tmpfs): where tasks put their files.
    workspace: str = "/workspace"
    # Size cap of the workspace in MiB (tmpfs size, so writes past it fail with ENOSPC).
    # Raising it raises how much RAM a runaway write can pin (tmpfs is memory).
    workspace_limit_mb: int = 256
    # Size cap in MiB of /tmp and of /dev/shm, each (tmpfs too, so memory as well).
    tmp_limit_mb: int = 64
    # Largest single file any process may write, in MiB (RLIMIT_FSIZE); 0 = the workspace
    # limit. The last guard when read_only is off; raising it lets one file fill the disk.
    max_file_mb: int = 0
    # Bytes kept of stdout and of stderr per exec; the rest is dropped and marked.
    # Raising it lets one chatty command bloat the episode and the LLM context.
    max_output_bytes: int = 64 * 1024
    # Default exec timeout in seconds (exec(timeout=...) overrides it).
    timeout: float = 60.0
    # Seconds to wait for a killed command's output stream to close before the sandbox
    # is declared dead (and replaced by the pool).
    kill_grace: float = 3.0
    # Extra container labels (vime.* labels are always added).
    labels: dict[str, str] = field(default_factory=dict)
    # Extra environment for every command (HOME points at the workspace by default).
    env: dict[str, str] = field(default_factory=dict)
    # Run id written into the `vime.run` label; "" = this process's DEFAULT_RUN_ID.
    run_id: str = ""
    # Docker hosts (DOCKER_HOST URLs) to spread sandboxes over; [] = $DOCKER_HOST.
    docker_hosts: list[str] = field(default_factory=list)
    # Envs lease their sandboxes from this process's warm pool of the image (wiped on
    # return, see vime.sandbox.leases). Off, each episode starts a cold container
    # (0.3-1.2 s more per episode).
    pool: bool = True
    # Sandboxes each image's pool starts up front (kept warm between steps).
    pool_warm: int = 2
    # Most sandboxes of one image alive at once (leased + idle + starting); episodes
    # past it wait for a free one. Raising it raises memory use (``memory`` each).
    pool_max: int = 32
    # Seconds a sandbox above ``pool_warm`` may sit idle before it is removed, so a pool
    # that grew for a busy step shrinks back between steps; 0 keeps them until exit.
    pool_idle_s: float = 60.0
    # Most sandboxes of one pool on any one docker host; 0 = only ``pool_max``. Lower it
    # when a host is small: the pool then fills the other hosts instead.
    per_host_limit: int = 0

    def __post_init__(self) -> None:
        try:
            parse_size(self.memory)
        except ValueError as err:
            require(False, "sandbox.memory", f"{err}")
        require(parse_size(self.memory) >= 16 * 1024**2, "sandbox.memory", "must be at least 16m")
        require(
            self.pids_limit == -1 or self.pids_limit >= 16,
            "sandbox.pids_limit",
            "must be >= 16 (or -1 for none)",
        )
        require(0 < self.cpus <= 256, "sandbox.cpus", f"must be in (0, 256], got {self.cpus}")
        require(
            bool(re.fullmatch(r"\d+(:\d+)?", self.user)),
            "sandbox.user",
            f"must be numeric 'uid:gid' like '1000:1000', got {self.user!r}",
        )
        require(
            self.workspace.startswith("/") and self.workspace != "/",
            "sandbox.workspace",
            "must be an absolute folder other than /",
        )
        require(self.workspace_limit_mb >= 1, "sandbox.workspace_limit_mb", "must be >= 1")
        require(self.tmp_limit_mb >= 1, "sandbox.tmp_limit_mb", "must be >= 1")
        require(
            self.max_file_mb >= 0, "sandbox.max_file_mb", "must be >= 0 (0 = workspace_limit_mb)"
        )
        require(self.max_output_bytes >= 256, "sandbox.max_output_bytes", "must be >= 256")
        require(self.timeout > 0, "sandbox.timeout", "must be > 0 seconds")
        require(self.kill_grace > 0, "sandbox.kill_grace", "must be > 0 seconds")
        require(self.pool_max >= 1, "sandbox.pool_max", f"must be >= 1, got {self.pool_max}")
        require(
            0 <= self.pool_warm <= self.pool_max,
            "sandbox.pool_warm",
            f"must be in [0, pool_max={self.pool_max}], got {self.pool_warm}",
        )
        require(self.per_host_limit >= 0, "sandbox.per_host_limit", "must be >= 0 (0 = no limit)")
        require(self.pool_idle_s >= 0, "sandbox.pool_idle_s", "must be >= 0 (0 = keep them)")
        for host in self.docker_hosts:
            require(
                host.startswith(("unix://", "tcp://", "ssh://", "http://", "https://")),
                "sandbox.docker_hosts",
                f"{host!r} is not a DOCKER_HOST URL (unix:///path.sock or tcp://host:2376)",
            )

    @property
    def memory_bytes(self) -> int:
        """The memory limit in bytes."""
        return parse_size(self.memory)

    @property
    def file_limit_bytes(self) -> int:
        """RLIMIT_FSIZE in bytes."""
        return (self.max_file_mb or self.workspace_limit_mb) * 1024**2

    @property
    def effective_run_id(self) -> str:
        """The run id containers are labelled with."""
        return self.run_id or DEFAULT_RUN_ID

    def hosts(self) -> list[str]:
        """The docker hosts to use (``docker_hosts`` or the current DOCKER_HOST).

        Example:
            >>> SandboxConfig(docker_hosts=["unix:///a.sock"]).hosts()
            ['unix:///a.sock']
        """
        from vime.sandbox.client import default_host

        return list(self.docker_hosts) or [default_host()]
