"""A local S3-protocol server for the test suite: moto, with requests serialised.

moto's threaded server checks conditional headers (If-None-Match, If-Match) and then writes
without a lock, so under contention several conditional creates of one key can all win. Real
S3 decides such races atomically. Holding one lock around moto's WSGI app, for the whole
request including its response body, makes moto decide them the same way.

Usage: python scripts/s3_server.py PORT BUCKET [BUCKET ...]
Prints "ready <port>" once it accepts requests and the buckets exist.
"""

import sys
import threading
import urllib.request

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import make_server


class Serialised:
    def __init__(self, app):
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ, start_response):
        with self.lock:
            response = self.app(environ, start_response)
            try:
                body = b"".join(response)
            finally:
                close = getattr(response, "close", None)
                if close is not None:
                    close()
        return [body]


def main():
    port = int(sys.argv[1])
    buckets = sys.argv[2:]
    app = Serialised(DomainDispatcherApplication(create_backend_app))
    server = make_server("127.0.0.1", port, app, threaded=True, request_handler=MotoRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    # The credential scope in the Authorization header routes the request to moto's S3.
    auth = (
        "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/s3/aws4_request, "
        "SignedHeaders=host, Signature=0"
    )
    for bucket in buckets:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/{bucket}", method="PUT", headers={"Authorization": auth}
        )
        urllib.request.urlopen(request).read()
    print(f"ready {port}", flush=True)
    thread.join()


if __name__ == "__main__":
    main()
