"""A lane served on loopback that answers only a request carrying its credential: the query
``token=<secret>``, or basic auth ``lane:<secret>``; any other request is 401. A reader that
drops the token (or the userinfo) on any one request fails there.

Run as a process: ``python tests/guarded_lane_server.py DIRECTORY PORT PREFIX SECRET``
serves DIRECTORY below the URL path PREFIX (``/validation/``); each request's path and
whether it was let in go to standard output (the server's log), never its credential.
"""

from __future__ import annotations

import base64
import functools
import http.server
import sys
import urllib.parse
from typing import Any


class Guarded(http.server.SimpleHTTPRequestHandler):
    secret = ""
    prefix = "/"

    def _allowed(self) -> bool:
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        if query.get("token") == [self.secret]:
            return True
        basic = base64.b64encode(f"lane:{self.secret}".encode()).decode()
        return self.headers.get("Authorization") == f"Basic {basic}"

    def _guard(self) -> bool:
        path = urllib.parse.urlsplit(self.path).path
        allowed = self._allowed()
        print(f"{'let in' if allowed else 'refused'} {path}", flush=True)
        if not allowed:
            self.send_error(401, "a token or basic auth is required")
        elif not path.startswith(self.prefix):
            self.send_error(404)
        else:
            return True
        return False

    def translate_path(self, path: str) -> str:
        return super().translate_path("/" + path[len(self.prefix) :])

    def do_GET(self) -> None:
        if self._guard():
            super().do_GET()

    def do_HEAD(self) -> None:
        if self._guard():
            super().do_HEAD()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the request line holds the token: _guard logs the path alone


def main() -> None:
    directory, port, prefix, secret = sys.argv[1:5]
    Guarded.secret, Guarded.prefix = secret, prefix
    handler = functools.partial(Guarded, directory=directory)
    with http.server.ThreadingHTTPServer(("127.0.0.1", int(port)), handler) as server:
        server.serve_forever()


if __name__ == "__main__":
    main()
