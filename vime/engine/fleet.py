"""An engine fleet: the vLLM servers one node launched, and the URLs of the whole fleet.

A node launches its engines together (each on its own devices), waits until all are
ready, and answers for them afterwards: :meth:`EngineFleet.restart_dead` brings back any
that died, on the same port, so URLs handed out stay valid. Engines on other nodes and
external engines are known here only by URL; :meth:`EngineFleet.join` adds them.

Usage (no doctest: it starts vLLM servers): ``with EngineFleet.launch(EngineConfig(),
model_dir, count=2) as fleet:`` gives ``fleet.urls``, one per server; the class example
builds a fleet of external URLs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from vime.engine.client import EngineClient
from vime.engine.config import EngineConfig
from vime.engine.server import VLLMServer

log = logging.getLogger(__name__)


class EngineFleet:
    """The servers this process launched plus every URL of the fleet (see the module docstring).

    Example:
        >>> EngineFleet([], ["http://10.0.0.7:8000"]).urls
        ['http://10.0.0.7:8000']
    """

    def __init__(
        self, servers: Sequence[VLLMServer], urls: Sequence[str], *, advertise: str = ""
    ) -> None:
        self.servers = list(servers)
        self.advertise = advertise  # the address other nodes reach this node's engines at
        self.urls = [u.rstrip("/") for u in urls]
        self.launched: list[str] = []  # the fleet's engines that vime launched (any node)

    @classmethod
    @contextlib.contextmanager
    def launch(
        cls,
        config: EngineConfig,
        model_dir: str | Path,
        *,
        count: int = 1,
        devices: Sequence[Sequence[int]] = (),
        log_dir: str | Path | None = None,
        advertise: str = "",
        api_key: str = "",
        sleep_mode: bool = False,
        weight_transfer: str = "",
        meanwhile: Callable[[], object] | None = None,
    ) -> Iterator[EngineFleet]:
        """Start ``count`` servers on ``model_dir`` (in parallel), stop them on exit.

        ``devices[i]`` are engine i's CUDA devices (its tensor-parallel size is their
        number); empty on CPU. ``advertise`` is this node's address on the route to the
        run's other nodes: the servers listen there, and on no other interface; empty:
        ``config.host`` (127.0.0.1 by default, this machine only). ``api_key``: the key
        every server requires (``config.api_key`` when empty; see
        :mod:`vime.engine.vllm_auth` for the routes it guards).
        ``sleep_mode`` lets the servers give their GPU memory to a colocated trainer.
        ``weight_transfer`` (``nccl`` / ``ipc``) starts them ready for that GPU weight
        sync (:func:`weight_transfer_launch`); ``disk`` or empty: no flags.
        ``meanwhile()`` runs while they start (the run builds its trainer there: an engine's
        start is mostly its processes importing vLLM, one core each).
        """
        args, env = weight_transfer_launch(weight_transfer)
        config = dataclasses.replace(
            config,
            extra_args=[*config.extra_args, *args],
            env={**config.env, **env},
            api_key=api_key or config.api_key,
        )
        servers = [
            VLLMServer(
                _engine_config(config, model_dir, i, devices, log_dir, advertise, sleep_mode)
            )
            for i in range(count)
        ]
        try:
            for server in servers:  # all start at once; each startup is mostly waiting
                server.start(wait=False)
            if meanwhile is not None:
                meanwhile()
            for server in servers:
                server.wait_ready()
            fleet = cls(servers, [], advertise=advertise)
            fleet.urls = fleet.local_urls()
            yield fleet
        finally:
            for server in servers:
                server.stop()

    def local_urls(self) -> list[str]:
        """The URLs of the servers launched here, as other nodes reach them.

        Example:
            >>> EngineFleet([], []).local_urls()
            []
        """
        if not self.advertise:
            return [s.url for s in self.servers]
        return [f"http://{self.advertise}:{s.port}" for s in self.servers]

    def join(self, urls: Sequence[str]) -> None:
        """Make ``urls`` (other nodes' engines, external engines) part of the fleet.

        Example:
            >>> f = EngineFleet([], ["http://a:1"]); f.join(["http://b:2/", "http://a:1"]); f.urls
            ['http://a:1', 'http://b:2']
        """
        for url in urls:
            url = url.rstrip("/")
            if url not in self.urls:
                self.urls.append(url)

    def restart_dead(self) -> list[str]:
        """Restart the servers launched here that stopped answering; returns their URLs.

        A restarted server serves the weights it was launched with: the caller reloads
        the current version before it takes new work.

        Example:
            >>> EngineFleet([], []).restart_dead()
            []
        """
        restarted = []
        for server, url in zip(self.servers, self.local_urls(), strict=True):
            if server.health(timeout_s=5.0):
                continue
            log.warning("engine %s is down; restarting it", url)
            server.restart()
            restarted.append(url)
        return restarted


def _engine_config(
    config: EngineConfig,
    model_dir: str | Path,
    index: int,
    devices: Sequence[Sequence[int]],
    log_dir: str | Path | None,
    advertise: str,
    sleep_mode: bool,
) -> EngineConfig:
    """Engine ``index``'s config: the shared one plus its model, devices, host and log folder."""
    env = dict(config.env)
    extra = list(config.extra_args)
    if sleep_mode:
        extra.append("--enable-sleep-mode")
    mine = list(devices[index]) if index < len(devices) else []
    if mine:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in mine)
        if len(mine) > 1:
            extra += ["--tensor-parallel-size", str(len(mine))]
    return dataclasses.replace(
        config,
        model=str(model_dir),
        host=advertise or config.host,  # one interface: the route to the other nodes
        env=env,
        extra_args=extra,
        log_dir=config.log_dir or str(log_dir or ""),  # one log per port: engines share it
    )


def weight_transfer_launch(backend: str) -> tuple[list[str], dict[str, str]]:
    """The ``vllm serve`` flags and environment for a GPU weight-sync ``backend``.

    Both need ``--weight-transfer-config``. IPC also needs
    ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` (the CUDA IPC handles travel pickled over
    HTTP) and, where ray is not installed, a stand-in ``ray`` module: vLLM 0.26.0's IPC
    engine imports ray at module level although HTTP transfers never use it.

    Example:
        >>> weight_transfer_launch("nccl")
        (['--weight-transfer-config', '{"backend": "nccl"}'], {})
    """
    if backend in ("", "disk"):
        return [], {}
    args = ["--weight-transfer-config", json.dumps({"backend": backend})]
    if backend != "ipc":
        return args, {}
    env = {"VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
    if importlib.util.find_spec("ray") is None:
        path = [ray_stub_dir(), os.environ.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    return args, env


def ray_stub_dir() -> str:
    """A folder holding a stand-in ``ray`` package (see :func:`weight_transfer_launch`).

    Example:
        >>> (Path(ray_stub_dir()) / "ray" / "__init__.py").is_file()
        True
    """
    folder = Path(tempfile.gettempdir()) / "vime-ray-stub"
    init = folder / "ray" / "__init__.py"
    if not init.is_file():
        init.parent.mkdir(parents=True, exist_ok=True)
        tmp = init.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(_RAY_STUB)
        tmp.replace(init)  # atomic: engines starting together never import half a file
    return str(folder)


# vLLM probes ray with ray.is_initialized() and tolerates ImportError / AttributeError.
_RAY_STUB = '''"""Stand-in for ray (not installed), written by vime.engine.fleet: vLLM 0.26.0's IPC
weight transfer imports ray at module level; vime sends IPC handles over HTTP, not ray."""


def is_initialized():
    return False
'''


@contextlib.contextmanager
def asleep(engines: Sequence[EngineClient], enabled: bool = True) -> Iterator[None]:
    """Engines sleep inside the block (their GPU memory goes to a colocated trainer) and
    wake up after it, before the weight sync loads new weights into them.

    Usage (no doctest: it needs GPU engines started with sleep mode): ``with
    asleep(engines): trainer.train_step(samples)``.
    """
    if not enabled:
        yield
        return
    for engine in engines:
        engine.sleep(level=1)
    try:
        yield
    finally:
        for engine in engines:
            engine.wake_up()
