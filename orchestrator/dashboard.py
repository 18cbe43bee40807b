"""``launch-study dashboard``: optuna-dashboard on a study's database, the trials' models from
the artifacts (a folder or an object store) as its artifacts."""

from __future__ import annotations

import errno
import socket
import sys
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from optuna_dashboard import wsgi

from orchestrator.artifacts import TrialArtifacts, check_root, parse_root
from orchestrator.errors import UserError
from orchestrator.storage import open_store


def serve_dashboard(storage_url: str, artifacts: str, host: str, port: int) -> None:
    """optuna-dashboard's public WSGI app on wsgiref's server, as optuna-dashboard's own command
    serves it: a thread per request. The main thread then only waits for connections, so SIGTERM
    (raised there as ``Interrupted``) or Ctrl-C always ends ``serve_forever``. With bottle's
    one-thread server (``run_server``, until December 2026) a signal that came during a request
    was swallowed by wsgiref's handler (it catches everything and answers 500) and the dashboard
    ran on; and a client that connected and sent nothing held the only thread."""

    class Server(ThreadingMixIn, WSGIServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        daemon_threads = True  # a request in hand does not keep the process alive
        block_on_close = False

        def handle_error(self, request, client_address) -> None:
            # A connection that dropped, or that the stopping server closed under a thread still
            # reading it (EBADF, seen in CI after SIGTERM), is not worth a traceback.
            error = sys.exc_info()[1]
            if not (isinstance(error, ConnectionError) or getattr(error, "errno", None) == errno.EBADF):
                super().handle_error(request, client_address)

    class QuietHandler(WSGIRequestHandler):
        """No line per request: the page polls every few seconds (errors are still printed)."""

        def log_request(self, code="-", size="-") -> None:
            pass

    root = parse_root(artifacts)
    check_root(root, write=False)  # a store that does not answer: one line, before serving
    store = open_store(storage_url, create=False)
    app = wsgi(store.storage, artifact_store=TrialArtifacts(root))
    try:
        server = make_server(host, port, app, Server, QuietHandler)
    except (OSError, OverflowError) as err:  # the port taken or out of range, an address not ours
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise UserError(f"--host {host} --port {port}: cannot listen there ({reason})") from None
    with server:
        print(f"optuna-dashboard on {store.safe_url}: http://{host}:{port}/", file=sys.stderr)
        server.serve_forever()
