"""Docker clients per host, and the one place docker errors become :class:`SandboxError`.

Every call into the docker SDK goes through :func:`docker_errors`, so callers only ever see
vime's exception tree, with a message that says what was being done and on which host.

Example:
    >>> with docker_errors("listing containers", host="unix:///nonexistent.sock"):
    ...     pass
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

from vime.errors import ConfigError, SandboxError

# The project's dockerd speaks API 1.41 (Debian's docker.io 20.10); pinning avoids a
# version round trip on every new client and fails clearly on an older daemon.
API_VERSION = "1.41"

_clients: dict[str, object] = {}
_lock = threading.Lock()


def default_host() -> str:
    """The DOCKER_HOST in effect: ``$DOCKER_HOST``, else the project's own dockerd (the
    address ``scripts/dockerd.sh start`` recorded), else docker's default socket.

    Example:
        >>> default_host().startswith(("unix://", "tcp://", "ssh://", "npipe://"))
        True
    """
    if os.environ.get("DOCKER_HOST"):
        return os.environ["DOCKER_HOST"]
    from vime.paths import run_state_dir

    recorded = run_state_dir() / "docker" / "host"
    if recorded.exists():
        return recorded.read_text().strip()
    return "unix:///var/run/docker.sock"


def used_hosts() -> list[str]:
    """The docker hosts this process has a client for (the stall report pings them).

    Example:
        >>> docker_client() and default_host() in used_hosts()
        True
    """
    with _lock:
        return sorted(_clients)


def docker_client(host: str | None = None):
    """A shared ``docker.DockerClient`` for ``host`` (default: :func:`default_host`).

    Clients are cached per host URL and are thread-safe for the calls vime makes (each
    request takes its own connection from the pool).

    Example (the project's dockerd; ``scripts/dockerd.sh start`` prints its URL):
        >>> client = docker_client()
        >>> client.ping()
        True
    """
    import docker

    host = host or default_host()
    with _lock:
        client = _clients.get(host)
        if client is None:
            with docker_errors("connecting", host=host):
                # A pool as large as the biggest sandbox pool we expect: with the default
                # of 10, 32 concurrent execs wait for connections and look slow.
                client = docker.DockerClient(
                    base_url=host, version=API_VERSION, timeout=120, max_pool_size=64
                )
            _clients[host] = client
        return client


def daemon_answers(host: str, timeout: float = 5.0) -> bool:
    """Whether the daemon at ``host`` takes a new connection and answers a ping.

    A throwaway client, not the shared one: a dockerd that is stopping closes its socket
    first but goes on answering (containers "running") on connections already open, which
    the shared client's pool reuses.

    Example:
        >>> daemon_answers("unix:///nonexistent.sock"), daemon_answers(default_host())
        (False, True)
    """
    import docker

    try:
        client = docker.APIClient(base_url=host, version=API_VERSION, timeout=timeout)
    except Exception:
        return False
    try:
        return bool(client.ping())
    except Exception:
        return False
    finally:
        client.close()


def check_docker(hosts: list[str], *, needed_by: str) -> None:
    """Ping the Docker daemon at each of ``hosts``; raise :class:`ConfigError` (key
    ``sandbox.docker_hosts``) naming the host and how to start one if any is silent.

    ``needed_by`` says who needs it (``"vime/SWE-v0"``), for the message. Envs call it
    from :meth:`~vime.envs.Env.preflight`, with ``SandboxConfig.hosts()``.

    Example:
        >>> try:
        ...     check_docker(["unix:///nonexistent.sock"], needed_by="my/Env-v0")
        ... except ConfigError as err:
        ...     print(err.key)
        sandbox.docker_hosts
    """
    for host in hosts:
        try:
            with docker_errors("pinging the daemon", host=host):
                docker_client(host).ping()
        except SandboxError as err:
            cause = err.__cause__ or err
            raise ConfigError(
                f"sandbox.docker_hosts: {needed_by} runs code in Docker sandboxes, and no "
                f"Docker daemon answers at {host} ({type(cause).__name__}: {cause}). Start "
                "one with `bash scripts/dockerd.sh start` and export the DOCKER_HOST it "
                "prints, or list reachable daemons in the env's sandbox.docker_hosts "
                "(env.kwargs.sandbox.docker_hosts in a train config)",
                key="sandbox.docker_hosts",
            ) from err


@contextlib.contextmanager
def docker_errors(
    what: str, *, host: str | None = None, container: str | None = None
) -> Iterator[None]:
    """Turn any docker SDK / transport error raised inside into a :class:`SandboxError`.

    ``what`` says what was being done ("creating a container"); the message adds the host,
    the container and the likely fix.

    Example:
        >>> try:
        ...     with docker_errors("pinging", host="unix:///x.sock"):
        ...         raise ConnectionError("refused")
        ... except SandboxError as err:
        ...     print(str(err).split(":")[0])
        docker error while pinging on unix
    """
    import docker.errors
    import requests.exceptions

    where = f" on {host}" if host else ""
    if container:
        where += f" (container {container[:12]})"
    try:
        yield
    except SandboxError:
        raise
    except docker.errors.ImageNotFound as err:
        raise SandboxError(
            f"docker error while {what}{where}: image not found ({_explain(err)}); "
            "build it with `vime-agent sandbox build-base` (or load it) on that host"
        ) from err
    except docker.errors.NotFound as err:
        raise SandboxError(
            f"docker error while {what}{where}: not found ({_explain(err)}); "
            "the container was probably removed or killed from outside"
        ) from err
    except docker.errors.APIError as err:
        raise SandboxError(f"docker error while {what}{where}: {_explain(err)}") from err
    except docker.errors.DockerException as err:
        raise SandboxError(
            f"docker error while {what}{where}: {err}; is dockerd running? "
            "start it with `bash scripts/dockerd.sh start` and export the DOCKER_HOST it prints"
        ) from err
    except (requests.exceptions.RequestException, ConnectionError, OSError) as err:
        raise SandboxError(
            f"docker error while {what}{where}: {type(err).__name__}: {err}; is dockerd "
            "running and reachable? (`bash scripts/dockerd.sh status`)"
        ) from err


def _explain(err: Exception) -> str:
    explanation = getattr(err, "explanation", None)
    return str(explanation or err).strip()
