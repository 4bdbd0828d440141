"""SWE-bench instance images pulled from a registry, under the names the harness gives them.

With ``swe.image_source=registry`` and ``swe.registry=HOST[:PORT][/NAMESPACE]`` each
record's image is the harness's name for its instance under that registry (swebench's
own ``expected_image``: ``sweb.eval.x86_64.<instance_id>:latest``, lower-cased, with
``__`` written ``_1776_`` because Docker Hub refuses double underscores), pulled onto the
first Docker host and copied to the others (as built images are), and never built. The
namespace defaults to the harness's, ``swebench``.

Example:
    >>> registry_image("django__django-11099", "127.0.0.1:55050")
    '127.0.0.1:55050/swebench/sweb.eval.x86_64.django_1776_django-11099:latest'
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from vime.config import require, require_choice
from vime.errors import DataError

IMAGE_SOURCES = ("build", "registry")
# The harness's own namespace on Docker Hub (swebench/sweb.eval.x86_64...).
DEFAULT_NAMESPACE = "swebench"
# host[:port], then lower-case path components (Docker's reference grammar, simplified).
_REGISTRY = re.compile(
    r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*"
)
EXAMPLE = "127.0.0.1:55050 (bash scripts/registry.sh start prints it)"


def check_image_source(image_source: str, registry: str) -> None:
    """Refuse a registry without ``image_source=registry``, and the other way round.

    Example:
        >>> check_image_source("build", "127.0.0.1:55050")
        Traceback (most recent call last):
        ...
        vime.errors.ConfigError: swe.registry: '127.0.0.1:55050' does nothing with swe.image_source='build' (images are built or already on the Docker host): set swe.image_source=registry to pull from it, or leave swe.registry unset
    """
    require_choice(image_source, "swe.image_source", IMAGE_SOURCES)
    require(
        not registry or image_source == "registry",
        "swe.registry",
        f"{registry!r} does nothing with swe.image_source={image_source!r} (images are "
        "built or already on the Docker host): set swe.image_source=registry to pull from "
        "it, or leave swe.registry unset",
    )
    require(
        bool(registry) or image_source != "registry",
        "swe.image_source",
        f"'registry' needs swe.registry, the registry to pull from: HOST[:PORT][/NAMESPACE], "
        f"e.g. {EXAMPLE}",
    )
    require(
        not registry or _REGISTRY.fullmatch(registry) is not None,
        "swe.registry",
        f"{registry!r} is not HOST[:PORT][/NAMESPACE] (no scheme, no image name; the "
        f"namespace lower-case), e.g. {EXAMPLE}",
    )


def registry_image(instance_id: str, registry: str) -> str:
    """The harness's image name of ``instance_id`` in ``registry`` (``HOST[:PORT][/NS]``).

    Example:
        >>> registry_image("pallets__flask-1", "reg.local:5000/mirror")
        'reg.local:5000/mirror/sweb.eval.x86_64.pallets_1776_flask-1:latest'
    """
    from swebench.task.checks import expected_image

    host, _, namespace = registry.partition("/")
    return expected_image(instance_id, namespace=f"{host}/{namespace or DEFAULT_NAMESPACE}")


def pull_instance_images(
    images: dict[str, str], registry: str, hosts: Sequence[str] | None = None, *, log: Any = print
) -> None:
    """Pull every image (``{where: reference}``) on the first host; copy it to the others.

    A pull that fails (the registry down, the image not pushed) is a :class:`DataError`
    naming the record, the image and ``swe.registry``.

    Usage (no doctest: it needs the project's registry with the instance's image pushed,
    scripts/registry.sh): ``pull_instance_images({"record 1": registry_image("a__b-1",
    "127.0.0.1:55050")}, "127.0.0.1:55050")``.
    """
    import docker.errors
    import requests.exceptions

    from vime.sandbox.client import docker_client
    from vime.sandbox.images import distribute_image

    hosts = list(dict.fromkeys(hosts or []))
    first = hosts[0] if hosts else None
    unique = {ref: where for where, ref in images.items()}
    for n, (ref, where) in enumerate(unique.items()):
        log(f"pulling {ref} ({n + 1}/{len(unique)})")
        try:
            # Pulled even when present: the registry's image is the one graded against.
            docker_client(first).images.pull(ref)
        except (docker.errors.DockerException, requests.exceptions.RequestException) as err:
            explanation = getattr(err, "explanation", None) or err
            raise DataError(
                f"{where}: pulling its image {ref} from swe.registry {registry!r} failed: "
                f"{explanation}; push the image there under this name, or check that the "
                "registry answers (bash scripts/registry.sh status)"
            ) from None
        if len(hosts) > 1:
            distribute_image(ref, hosts)
