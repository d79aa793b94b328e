"""Where committed shards go: a folder or any S3-compatible bucket.

Objects are keyed like the output layout (`shards/...`, `manifest.jsonl`) and carry their
sha256, so an upload is skipped when the same bytes are already there. boto3's transfer
manager does multipart uploads; credentials come from the standard AWS chain.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from infra.files import atomic_write
from infra.manifest import file_sha256

SHA_KEY = "sha256"


class StorageError(RuntimeError):
    """The destination refused or could not be reached; the message says which and why."""


class Destination(Protocol):
    @property
    def label(self) -> str: ...

    def sha256_of(self, key: str) -> str | None: ...
    def put(self, source: Path, key: str, sha256: str) -> None: ...
    def get_bytes(self, key: str) -> bytes | None: ...
    def put_bytes(self, data: bytes, key: str) -> None: ...
    def list_keys(self, prefix: str) -> list[str]: ...


@dataclass(frozen=True)
class FolderDestination:
    """A local or mounted folder."""

    root: Path

    @property
    def label(self) -> str:
        return str(self.root)

    def sha256_of(self, key: str) -> str | None:
        target = self.root / key
        return file_sha256(target) if target.is_file() else None

    def put(self, source: Path, key: str, sha256: str) -> None:
        target = self.root / key
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        shutil.copyfile(source, tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, target)

    def get_bytes(self, key: str) -> bytes | None:
        target = self.root / key
        return target.read_bytes() if target.is_file() else None

    def put_bytes(self, data: bytes, key: str) -> None:
        target = self.root / key
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(target, data, fsync=True)

    def list_keys(self, prefix: str) -> list[str]:
        base = self.root / prefix
        if not base.is_dir():
            return []
        return sorted(str(p.relative_to(self.root)) for p in base.rglob("*")
                      if p.is_file() and not p.name.startswith("."))


@dataclass(frozen=True)
class S3Patience:
    """How long a request to S3 may take, and how often it is tried (botocore's standard
    retries: throttling and 5xx)."""

    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0
    attempts: int = 3


class S3Destination:
    """s3://bucket/prefix through boto3 (any S3-compatible endpoint via endpoint_url)."""

    def __init__(self, bucket: str, prefix: str, endpoint_url: str | None = None,
                 region: str | None = None, multipart_mb: int = 64,
                 patience: S3Patience = S3Patience()) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.label = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.client = boto3.client(
            "s3", endpoint_url=endpoint_url, region_name=region or "us-east-1",
            config=Config(connect_timeout=patience.connect_timeout_s,
                          read_timeout=patience.read_timeout_s,
                          retries={"max_attempts": patience.attempts, "mode": "standard"}))
        chunk = multipart_mb * 1024 * 1024
        self.transfer = TransferConfig(multipart_threshold=chunk, multipart_chunksize=chunk)

    def key_of(self, key: str) -> str:
        """The object key of an output-relative key (under the prefix)."""
        return f"{self.prefix}/{key}" if self.prefix else key

    def _read(self, call: str, key: str) -> dict[str, Any] | None:
        """head_object/get_object; None for a missing key, StorageError for anything else."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            answer: dict[str, Any] = getattr(self.client, call)(Bucket=self.bucket,
                                                                Key=self.key_of(key))
        except ClientError as exc:
            if _status(exc) == 404:
                return None
            raise StorageError(f"{self.label}/{key}: {exc}") from exc
        except BotoCoreError as exc:
            raise StorageError(f"{self.label}: {exc}") from exc
        return answer

    def sha256_of(self, key: str) -> str | None:
        head = self._read("head_object", key)
        if head is None:
            return None
        meta: dict[str, str] = head.get("Metadata", {})
        return meta.get(SHA_KEY)

    def put(self, source: Path, key: str, sha256: str) -> None:
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.upload_file(str(source), self.bucket, self.key_of(key),
                                    ExtraArgs={"Metadata": {SHA_KEY: sha256}},
                                    Config=self.transfer)
        except (ClientError, BotoCoreError, S3UploadFailedError) as exc:
            raise StorageError(f"upload of {key} to {self.label} failed: {exc}") from exc

    def put_bytes(self, data: bytes, key: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.put_object(Bucket=self.bucket, Key=self.key_of(key), Body=data)
        except (ClientError, BotoCoreError) as exc:
            raise StorageError(f"write of {key} to {self.label} failed: {exc}") from exc

    def list_keys(self, prefix: str) -> list[str]:
        from botocore.exceptions import BotoCoreError, ClientError

        keys: list[str] = []
        strip = f"{self.prefix}/" if self.prefix else ""
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.key_of(prefix))
            for page in pages:
                keys += [o["Key"].removeprefix(strip) for o in page.get("Contents", [])]
        except (ClientError, BotoCoreError) as exc:
            raise StorageError(f"listing {self.label}/{prefix}: {exc}") from exc
        return sorted(keys)

    def get_bytes(self, key: str) -> bytes | None:
        obj = self._read("get_object", key)
        if obj is None:
            return None
        body: bytes = obj["Body"].read()
        return body


def _status(exc: Any) -> int | None:
    code = exc.response.get("Error", {}).get("Code")
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if code in ("404", "NoSuchKey", "NotFound"):
        return 404
    return int(status) if status else None


def open_destination(target: str, endpoint_url: str | None = None, region: str | None = None,
                     multipart_mb: int = 64) -> Destination:
    """A Destination for `s3://bucket/prefix`, `file:///path` or a plain folder path."""
    if target.startswith("s3://"):
        parsed = urlparse(target)
        if not parsed.netloc:
            raise ValueError(f"upload_to: {target!r} has no bucket; use s3://bucket/prefix")
        return S3Destination(parsed.netloc, parsed.path, endpoint_url, region, multipart_mb)
    if "://" in target and not target.startswith("file://"):
        raise ValueError(f"upload_to: {target!r}: use s3://bucket/prefix or a folder path")
    return FolderDestination(Path(target.removeprefix("file://")))
