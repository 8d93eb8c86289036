"""docker-py as the launcher uses it, whatever the request: two of its faults corrected once, on import (an ssh
connection's close that fails on a pipe already closed; a TLS engine's CA replaced by REQUESTS_CA_BUNDLE or
CURL_CA_BUNDLE), and its exceptions (and the HTTP client's under it) turned into one NodeError naming the node
(translated_errors, over every public method of the driver, launcher/host/engines/docker_driver.py).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from docker.errors import DockerException
from requests.exceptions import RequestException

from launcher.host.engines.node_engine import NodeEngine, NodeError

Driver = TypeVar("Driver", bound=type)


def _tolerate_closed_ssh_pipe() -> None:
    """docker-py's ssh-client transport raises BrokenPipeError when it closes a connection whose ssh process
    has already gone, e.g. after an exec's output was read in full (docker/docker-py#3218, open). Closing an
    already-closed pipe loses nothing, so finish the close instead of failing the call."""
    from docker.transport import sshconn

    if getattr(sshconn.SSHSocket, "tolerates_closed_pipe", False):
        return
    original_close = sshconn.SSHSocket.close

    def close(self) -> None:
        try:
            original_close(self)
        except BrokenPipeError:
            self.proc.terminate()

    sshconn.SSHSocket.close = close
    sshconn.SSHSocket.tolerates_closed_pipe = True


_tolerate_closed_ssh_pipe()


def _keep_the_clients_ca() -> None:
    """requests lets REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE in the environment replace the CA a session was given
    (psf/requests#3829): a TLS engine's client would check the engine against the system's CAs instead of the
    engine's own ca.pem (and check even with DOCKER_TLS_VERIFY off), and fail, on every machine that sets them (many
    distributions' and CI images' default). A request that names no CA of its own takes its client's, as docker-py
    means it to."""
    from docker.api.client import APIClient

    if getattr(APIClient, "keeps_its_ca", False):
        return
    merge = APIClient.merge_environment_settings

    def merge_keeping_ca(self, url, proxies, stream, verify, cert):
        return merge(self, url, proxies, stream, self.verify if verify is None else verify, cert)

    APIClient.merge_environment_settings = merge_keeping_ca
    APIClient.keeps_its_ca = True


_keep_the_clients_ca()


def first_line(error: Exception) -> str:
    """An SDK error's first line (300 characters at most), for a NodeError's detail."""
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:300]


def _translated(method: Callable) -> Callable:
    """`method` with the SDK's own exceptions (and the HTTP client's under it) turned into one NodeError naming the
    node; a generator's too, while it is read."""

    def failure(engine: NodeEngine, error: Exception) -> NodeError:
        return NodeError(
            engine.node.name,
            f"its Docker engine failed a request ({first_line(error)}); see `docker info` and the engine's log there",
        )

    if inspect.isgeneratorfunction(method):

        @functools.wraps(method)
        def reading(self: NodeEngine, *args: Any, **kwargs: Any) -> Iterator:
            try:
                yield from method(self, *args, **kwargs)
            except (DockerException, RequestException) as error:
                raise failure(self, error) from None

        return reading

    @functools.wraps(method)
    def calling(self: NodeEngine, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except (DockerException, RequestException) as error:
            raise failure(self, error) from None

    return calling


def translated_errors(driver: Driver) -> Driver:
    """The driver class with every public method's SDK exceptions turned into NodeErrors (_translated)."""
    for name, member in list(vars(driver).items()):
        if inspect.isfunction(member) and not name.startswith("_"):
            setattr(driver, name, _translated(member))
    return driver
