"""An alert receiver on 127.0.0.1 for the alert tests: a webhook (HTTP POST of JSON) and a mail server
(enough SMTP for Python's smtplib, with STARTTLS and a PLAIN login when asked), each on a free port, in
threads; what arrived is kept in order."""

from __future__ import annotations

import base64
import json
import socketserver
import ssl
import threading
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass
class Received:
    posts: list[dict[str, Any]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)  # the path each post went to, in order
    mails: list[Message] = field(default_factory=list)
    recipients: list[list[str]] = field(default_factory=list)
    authorizations: list[str | None] = field(default_factory=list)  # each post's Authorization header
    mail_sessions: list[dict[str, Any]] = field(default_factory=list)  # per mail: over TLS, who logged in
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
                received.authorizations.append(self.headers.get("Authorization"))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


def _smtp(received: Received, tls: ssl.SSLContext | None = None, login: tuple[str, str] | None = None):
    """`tls`: STARTTLS offered (and required before a login); `login`: a PLAIN login required to send."""

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            rcpt: list[str] = []
            secure, user = False, None
            self.wfile.write(b"220 receiver ready\r\n")
            while line := self.rfile.readline():
                verb, _, argument = line.decode().strip().partition(" ")
                verb = verb.upper()
                if verb == "EHLO":
                    offers = ["receiver"]
                    if tls is not None and not secure:
                        offers.append("STARTTLS")
                    if login is not None and secure:
                        offers.append("AUTH PLAIN")
                    offers.append("8BITMIME")
                    lines = [f"250-{o}" for o in offers[:-1]] + [f"250 {offers[-1]}"]
                    self.wfile.write("".join(f"{one}\r\n" for one in lines).encode())
                elif verb == "STARTTLS" and tls is not None and not secure:
                    self.wfile.write(b"220 go ahead\r\n")
                    self.connection = tls.wrap_socket(self.connection, server_side=True)
                    self.rfile = self.connection.makefile("rb")
                    self.wfile = self.connection.makefile("wb", buffering=0)
                    secure = True
                elif verb == "AUTH" and login is not None and secure:
                    method, _, encoded = argument.partition(" ")
                    _, name, password = base64.b64decode(encoded).decode().split("\0")
                    if method.upper() == "PLAIN" and (name, password) == login:
                        user = name
                        self.wfile.write(b"235 authenticated\r\n")
                    else:
                        self.wfile.write(b"535 authentication failed\r\n")
                elif verb == "MAIL" and login is not None and user is None:
                    self.wfile.write(b"530 authentication required\r\n")
                elif verb == "DATA":
                    self.wfile.write(b"354 end with <CRLF>.<CRLF>\r\n")
                    data = b""
                    while (part := self.rfile.readline()) not in (b".\r\n", b""):
                        data += part[1:] if part.startswith(b"..") else part
                    with received.lock:
                        received.mails.append(message_from_bytes(data))
                        received.recipients.append(rcpt)
                        received.mail_sessions.append({"tls": secure, "user": user})
                    rcpt = []
                    self.wfile.write(b"250 queued\r\n")
                elif verb == "RCPT":
                    rcpt.append(line.decode().split(":", 1)[1].strip().strip("<>"))
                    self.wfile.write(b"250 ok\r\n")
                elif verb == "QUIT":
                    self.wfile.write(b"221 bye\r\n")
                    return
                elif verb in ("HELO", "MAIL", "RSET", "NOOP"):
                    self.wfile.write(b"250 ok\r\n")
                else:
                    self.wfile.write(b"502 not implemented\r\n")

    return Handler


class AlertReceiver:
    def __init__(self, tls: ssl.SSLContext | None = None, login: tuple[str, str] | None = None) -> None:
        self.received = Received()
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _webhook(self.received))
        self._mail = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _smtp(self.received, tls, login))
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


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, as PEM files (what a kubernetes.io/tls Secret holds): the
    scoring service's TLS test and the mail server's STARTTLS here."""
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fraud-scoring test")])
    now = dt.datetime.now(dt.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / "tls.crt", folder / "tls.key"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_file, key_file
