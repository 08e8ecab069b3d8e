"""An alert receiver on 127.0.0.1 for the alert tests: a webhook (HTTP POST of JSON) and a mail server
(enough SMTP for Python's smtplib), each on a free port, in threads; what arrived is kept in order."""

from __future__ import annotations

import json
import socketserver
import threading
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    posts: list[dict[str, Any]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)  # the path each post went to, in order
    mails: list[Message] = field(default_factory=list)
    recipients: list[list[str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def kinds(self) -> list[str]:
        with self.lock:
            return [p["kind"] for p in self.posts]


def _webhook(received: Received):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            with received.lock:
                received.posts.append(json.loads(body))
                received.paths.append(self.path)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


def _smtp(received: Received):
    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            rcpt: list[str] = []
            self.wfile.write(b"220 receiver ready\r\n")
            while line := self.rfile.readline():
                verb = line.decode().strip().split(" ", 1)[0].upper()
                if verb == "DATA":
                    self.wfile.write(b"354 end with <CRLF>.<CRLF>\r\n")
                    data = b""
                    while (part := self.rfile.readline()) not in (b".\r\n", b""):
                        data += part[1:] if part.startswith(b"..") else part
                    with received.lock:
                        received.mails.append(message_from_bytes(data))
                        received.recipients.append(rcpt)
                    rcpt = []
                    self.wfile.write(b"250 queued\r\n")
                elif verb == "RCPT":
                    rcpt.append(line.decode().split(":", 1)[1].strip().strip("<>"))
                    self.wfile.write(b"250 ok\r\n")
                elif verb == "QUIT":
                    self.wfile.write(b"221 bye\r\n")
                    return
                elif verb in ("EHLO", "HELO", "MAIL", "RSET", "NOOP"):
                    self.wfile.write(b"250 ok\r\n")
                else:
                    self.wfile.write(b"502 not implemented\r\n")

    return Handler


class AlertReceiver:
    def __init__(self) -> None:
        self.received = Received()
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _webhook(self.received))
        self._mail = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _smtp(self.received))
        self._mail.daemon_threads = True
        self._http.daemon_threads = True
        for server in (self._http, self._mail):
            threading.Thread(target=server.serve_forever, daemon=True).start()

    @property
    def webhook_url(self) -> str:
        return f"http://127.0.0.1:{self._http.server_address[1]}/hooks/mlops"

    @property
    def smtp_port(self) -> int:
        return self._mail.server_address[1]

    def environment(self) -> dict[str, str]:
        """The settings that send alerts here (MLOPS_ALERTS__*)."""
        return {
            "MLOPS_ALERTS__WEBHOOK_URL": self.webhook_url,
            "MLOPS_ALERTS__EMAIL_TO": '["risk-team@example.com"]',
            "MLOPS_ALERTS__SMTP_HOST": "127.0.0.1",
            "MLOPS_ALERTS__SMTP_PORT": str(self.smtp_port),
        }

    def close(self) -> None:
        for server in (self._http, self._mail):
            server.shutdown()
            server.server_close()
