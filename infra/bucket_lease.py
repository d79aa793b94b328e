"""The output's lease in the bucket prefix the job publishes to (infra/lease.py's store).

Two hosts given one `s3://bucket/prefix` each have their own staging folder, so a lease in
the folder cannot see the other: the bucket holds one too, `<prefix>/lease.json`. Its writes
are S3 conditional puts, which the store serializes, so of two runs that race exactly one
wins: creation with `If-None-Match: *`, takeover and renewal with `If-Match: <ETag read>`
(AWS S3 since 2024; MinIO and moto serve both; an endpoint that ignores them lets two runs
in, so use one that does). The lease's age is the store's own clock — the answer's `Date`
less the object's `Last-Modified` — so hosts whose clocks disagree still agree on when a
lease lapsed.
"""

from __future__ import annotations

from email.utils import parsedate_to_datetime
from typing import Any

from infra.lease import (
    LEASE,
    FolderLease,
    Found,
    LeaseStore,
    Owner,
    StoreUnreachable,
    owner_from_json,
    owner_json,
)
from infra.storage import FolderDestination, S3Destination, StorageError, open_destination

CONFLICT = {409, 412}  # ConditionalRequestConflict, PreconditionFailed: the other run won


class BucketLease:
    """`lease.json` under an S3 destination's prefix."""

    def __init__(self, dest: S3Destination) -> None:
        self.dest = dest
        self.key = dest.key_of(LEASE)

    @property
    def label(self) -> str:
        return f"{self.dest.label}/{LEASE}"

    def read(self) -> Found | None:
        obj = self._call("get_object")
        if obj is None:
            return None
        owner = owner_from_json(obj["Body"].read())
        if owner is None:
            return None
        said = obj["ResponseMetadata"]["HTTPHeaders"].get("date")
        age = ((parsedate_to_datetime(said) - obj["LastModified"]).total_seconds() if said
               else 0.0)
        return Found(owner, str(obj["ETag"]), max(age, 0.0))

    def create(self, owner: Owner) -> bool:
        return self._call("put_object", Body=owner_json(owner), IfNoneMatch="*") is not None

    def take(self, found: Found | None, owner: Owner) -> bool:
        if found is None:  # unreadable: replace the object as it is now, or create it
            head = self._call("head_object")
            if head is None:
                return self.create(owner)
            found = Found(owner, str(head["ETag"]), 0.0)
        return self._call("put_object", Body=owner_json(owner), IfMatch=found.version) is not None

    def renew(self, found: Found, owner: Owner) -> Found | None:
        answer = self._call("put_object", Body=owner_json(owner), IfMatch=found.version)
        return None if answer is None else Found(owner, str(answer["ETag"]), 0.0)

    def remove(self, found: Found) -> None:
        self._call("delete_object")

    def _call(self, name: str, **args: Any) -> dict[str, Any] | None:
        """One request on the lease's key: the answer; None for a missing key (a read) or a
        lost race (a conditional write); StoreUnreachable when the endpoint did not answer,
        StorageError when it refused."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            answer: dict[str, Any] = getattr(self.dest.client, name)(
                Bucket=self.dest.bucket, Key=self.key, **args)
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = exc.response.get("Error", {}).get("Code")
            missing = code in ("NoSuchKey", "404") and name in ("get_object", "head_object")
            if status in CONFLICT or missing:
                return None
            raise StorageError(f"{self.label}: {exc}") from exc
        except BotoCoreError as exc:
            raise StoreUnreachable(f"{self.label}: {exc}") from exc
        return answer


def leases_beside(target: str | None, endpoint_url: str | None,
                  region: str | None) -> list[LeaseStore]:
    """The leases a run holds beside its local folder's: the one where it publishes (a
    bucket prefix, or a shared folder given as `upload_to`), which runs on other hosts see."""
    if target is None:
        return []
    dest = open_destination(target, endpoint_url, region)
    if isinstance(dest, S3Destination):
        return [BucketLease(dest)]
    assert isinstance(dest, FolderDestination)
    return [FolderLease(dest.root.resolve())]
