"""A real S3-compatible HTTP server on loopback (moto's server mode) standing in for Nebius Object Storage."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from moto.server import ThreadedMotoServer

from infra.runs.store import make_s3_client

REGION = "eu-north1"
KEYS = {"access_key_id": "test-access-key", "secret_access_key": "test-secret-key"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class S3Server:
    server: ThreadedMotoServer
    endpoint: str

    def client(self, **kwargs: Any) -> Any:
        return make_s3_client(self.endpoint, REGION, **KEYS, **kwargs)

    def new_bucket(self, versioned: bool = True) -> str:
        name = f"t-{uuid.uuid4().hex[:12]}"
        s3 = self.client()
        s3.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": REGION})
        if versioned:
            s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
        return name


def start_server() -> S3Server:
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    return S3Server(server, f"http://127.0.0.1:{port}")


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    server = start_server()
    yield server
    server.server.stop()
