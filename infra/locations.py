"""Can the job write where it was told to? Checked before Prefect or a server starts.

Without these checks a run found out 20–35 s later, after the temporary Prefect API and the
flow had started, with a 175–269-line traceback: an output path that is a file, a folder
under a file, a read-only folder, an S3 endpoint that does not answer. Each function returns
the one line the user needs (the field, what is wrong, the fix), or None when all is well.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

if TYPE_CHECKING:
    from infra.settings import JobSettings


def location_problem(settings: JobSettings) -> str | None:
    """The output folder (or the staging folder of an s3:// output) and the bucket, if any:
    writable and reachable before anything starts."""
    field = "storage.staging_dir" if settings.output.startswith("s3://") else "output"
    problem = local_folder_problem(settings.local_output(), field)
    target = settings.upload_target()
    if problem is None and target is not None:
        field = "output" if settings.output.startswith("s3://") else "upload_to"
        if target.startswith("s3://"):
            problem = bucket_problem(target, field, settings.storage.endpoint_url,
                                     settings.storage.region)
        else:
            problem = local_folder_problem(Path(target.removeprefix("file://")), field)
    return problem


def local_folder_problem(path: Path, field: str) -> str | None:
    """Why `path` cannot be (or become) a folder the job writes into."""
    if path.exists() and not path.is_dir():
        return f"{field}: {path} is a file; give a folder path (it is created if missing)"
    existing = path
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        return (f"{field}: {path} would be a folder under {existing}, which is a file; "
                "choose another path")
    if not os.access(existing, os.W_OK | os.X_OK):
        return (f"{field}: cannot write in {existing} (permission denied); choose a folder "
                "you can write or fix its permissions")
    return None


def bucket_problem(target: str, field: str, endpoint_url: str | None, region: str | None,
                   timeout_s: float = 5.0) -> str | None:
    """Why s3://bucket/prefix cannot be written: the endpoint does not answer, the bucket is
    missing, or the credentials are refused (one HEAD request on the bucket, no retries)."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    from infra.storage import S3Destination, S3Patience

    bucket = urlparse(target).netloc
    where = f"endpoint {endpoint_url}" if endpoint_url else "AWS's endpoint"
    client = S3Destination(bucket, "", endpoint_url, region, patience=S3Patience(
        connect_timeout_s=timeout_s, read_timeout_s=timeout_s, attempts=1)).client
    try:
        client.head_bucket(Bucket=bucket)
    except NoCredentialsError:
        return (f"{field}: no S3 credentials for {target}; set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (or an AWS profile)")
    except ClientError as exc:
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status == 404:
            return f"{field}: bucket {bucket!r} does not exist at {where}; create it first"
        if status in (401, 403):
            return (f"{field}: {where} refused the credentials for bucket {bucket!r} "
                    f"(HTTP {status}); check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY")
        return f"{field}: {where} answered HTTP {status} for bucket {bucket!r}"
    except BotoCoreError as exc:
        return (f"{field}: cannot reach {where} for {target} ({exc}); check "
                "storage.endpoint_url and the network")
    return None
