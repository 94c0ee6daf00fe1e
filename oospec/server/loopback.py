"""The server on a loopback port inside this process (benchmarks and tests talk to it with a real client)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from oospec.errors import OospecError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(service, host: str = "127.0.0.1", port: int | None = None):
    """Run the app for `service` with uvicorn on a background thread; yields the base URL."""
    import uvicorn

    from oospec.server.app import create_app

    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(service), host=host, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="oospec-loopback-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise OospecError(f"the server did not start on {host}:{port}")
        time.sleep(0.05)
    try:
        yield f"http://{host}:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(60)
