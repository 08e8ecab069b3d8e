"""An S3-compatible endpoint on 127.0.0.1 for the residency tests: it answers a HEAD of a bucket the way S3
does, with a status and the bucket's region in `x-amz-bucket-region` (or without it), in a thread, and keeps
the paths it was asked for."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Bucket:
    url: str = ""
    status: int = 200
    region: str | None = "eu-west-1"
    asked: list[str] = field(default_factory=list)


@contextmanager
def bucket_endpoint(status: int = 200, region: str | None = "eu-west-1") -> Iterator[Bucket]:
    bucket = Bucket(status=status, region=region)

    class Handler(BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            bucket.asked.append(self.path)
            self.send_response(bucket.status)
            if bucket.region:
                self.send_header("x-amz-bucket-region", bucket.region)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    bucket.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield bucket
    finally:
        server.shutdown()
        server.server_close()
