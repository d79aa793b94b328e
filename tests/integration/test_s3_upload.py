"""Upload to a real S3 endpoint (moto server on 127.0.0.1): idempotent, verified, resumable."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest

from infra.manifest import Manifest, file_sha256
from infra.storage import S3Destination, S3Patience, StorageError, open_destination
from tasks.shards import prepare_job
from tasks.upload import ShardUploader, restore_from, upload_committed
from tests.rows import answered, failed


def committed_output(tmp_path: Path, shards: int = 3, size: int = 4) -> Path:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"q{i}"}) + "\n"
                               for i in range(shards * size)))
    out = tmp_path / "out"
    state = prepare_job(prompts, out, size)
    manifest = Manifest(out)
    for shard in range(shards):
        start, stop = state.shard_plan.rows_of(shard)
        rows = [answered(f"p{i}", f"c{i}") for i in range(start, stop)]
        manifest.commit_shard(state.shard_plan, shard, rows[:-1],
                            [failed(rows[-1]["id"], "HTTP 400: too long")])
    return out


def keys(endpoint: str, bucket: str) -> list[str]:
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    return sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", []))


def test_upload_is_complete_and_idempotent(tmp_path: Path, s3_endpoint: str,
                                           bucket: str) -> None:
    out = committed_output(tmp_path)
    dest = open_destination(f"s3://{bucket}/run-1", s3_endpoint)
    first = upload_committed(out, dest)
    assert first.uploaded == 6 and first.skipped == 0
    assert keys(s3_endpoint, bucket) == sorted(
        [f"run-1/shards/shard-00000{i}.parquet" for i in range(3)]
        + [f"run-1/errors/shard-00000{i}.parquet" for i in range(3)]
        + ["run-1/manifest.jsonl", "run-1/plan.json"])
    second = upload_committed(out, dest)
    assert second.uploaded == 0 and second.skipped == 6
    assert dest.sha256_of("shards/shard-000001.parquet") == file_sha256(
        out / "shards" / "shard-000001.parquet")


def test_a_damaged_remote_object_is_sent_again(tmp_path: Path, s3_endpoint: str,
                                               bucket: str) -> None:
    out = committed_output(tmp_path, shards=1)
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    s3.put_object(Bucket=bucket, Key="shards/shard-000000.parquet", Body=b"truncated",
                  Metadata={"sha256": "0" * 64})
    report = upload_committed(out, open_destination(f"s3://{bucket}", s3_endpoint))
    assert report.uploaded == 2
    body = s3.get_object(Bucket=bucket, Key="shards/shard-000000.parquet")["Body"].read()
    assert body == (out / "shards" / "shard-000000.parquet").read_bytes()


def test_an_interrupted_multipart_upload_does_not_count(tmp_path: Path, s3_endpoint: str,
                                                        bucket: str) -> None:
    out = committed_output(tmp_path, shards=1)
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    mpu = s3.create_multipart_upload(Bucket=bucket, Key="shards/shard-000000.parquet")
    s3.upload_part(Bucket=bucket, Key="shards/shard-000000.parquet", PartNumber=1,
                   UploadId=mpu["UploadId"], Body=b"x" * 1024)
    dest = S3Destination(bucket, "", s3_endpoint, multipart_mb=5)
    assert dest.sha256_of("shards/shard-000000.parquet") is None
    assert upload_committed(out, dest).uploaded == 2


def test_endpoint_down_is_a_clear_error_and_nothing_is_lost(tmp_path: Path, s3_endpoint: str,
                                                            bucket: str) -> None:
    out = committed_output(tmp_path)
    dead = S3Destination(bucket, "p", "http://127.0.0.1:9",
                         patience=S3Patience(connect_timeout_s=1, attempts=1))
    with pytest.raises(StorageError, match=r"127\.0\.0\.1:9"):
        upload_committed(out, dead)
    uploader = ShardUploader(dead, out)
    for entry in Manifest(out).committed().values():
        uploader.submit(entry)
    # The start (plan, the remote manifest) and the three shards failed: counted, not raised,
    # so generation goes on; nothing is published mid-run without the remote manifest.
    assert uploader.close() == 4
    report = upload_committed(out, open_destination(f"s3://{bucket}/p", s3_endpoint))
    assert report.uploaded == 6


def test_resume_on_a_new_machine_restores_from_the_bucket(tmp_path: Path, s3_endpoint: str,
                                                          bucket: str) -> None:
    out = committed_output(tmp_path)
    dest = open_destination(f"s3://{bucket}/r", s3_endpoint)
    upload_committed(out, dest)
    fresh = tmp_path / "elsewhere"
    assert restore_from(dest, fresh) == 3
    assert Manifest(fresh).committed().keys() == {0, 1, 2}
    assert (fresh / "plan.json").read_bytes() == (out / "plan.json").read_bytes()
    assert restore_from(dest, fresh) == 0  # already has a plan: nothing to do


def test_s3_503s_are_retried_and_the_upload_completes(tmp_path: Path, s3_endpoint: str,
                                                      bucket: str) -> None:
    """A proxy in front of the S3 server answers 503 SlowDown to the first PUTs."""
    import http.client
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import urlparse

    target = urlparse(s3_endpoint)
    refused = {"count": 0}

    class Flaky(BaseHTTPRequestHandler):
        def _forward(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.command == "PUT" and refused["count"] < 3:
                refused["count"] += 1
                err = (b'<?xml version="1.0"?><Error><Code>SlowDown</Code>'
                       b"<Message>Please reduce your request rate.</Message></Error>")
                self.send_response(503)
                self.send_header("Content-Length", str(len(err)))
                self.end_headers()
                self.wfile.write(err)
                return
            conn = http.client.HTTPConnection(str(target.hostname), target.port, timeout=30)
            conn.request(self.command, self.path, body=body, headers=dict(self.headers))
            resp = conn.getresponse()
            data = resp.read()
            self.send_response(resp.status)
            for key, value in resp.getheaders():
                if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward

        def log_message(self, *args: object) -> None:
            return

    proxy = ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        out = committed_output(tmp_path, shards=2)
        dest = S3Destination(bucket, "slow", f"http://127.0.0.1:{proxy.server_port}",
                             patience=S3Patience(attempts=5))
        report = upload_committed(out, dest)
    finally:
        proxy.shutdown()
    assert refused["count"] == 3  # the 503s really happened, and were retried through
    assert report.uploaded == 4
    assert len(keys(s3_endpoint, bucket)) == 6


def test_the_bucket_is_a_complete_record_mid_run(tmp_path: Path, s3_endpoint: str,
                                                 bucket: str) -> None:
    """Seen before: 6 shards in the bucket but no manifest, so a resume elsewhere redid all.
    Now each committed shard is followed by the manifest, on top of what earlier runs put."""
    out = committed_output(tmp_path, shards=3)
    entries = sorted(Manifest(out).committed().values(), key=lambda e: e.shard)
    dest = open_destination(f"s3://{bucket}/mid", s3_endpoint)
    earlier = ShardUploader(dest, out)  # an earlier run published shard 0, then died
    earlier.submit(entries[0])
    assert earlier.close() == 0
    uploader = ShardUploader(dest, out)  # this run commits shard 2 and is lost before the end
    uploader.submit(entries[2])
    assert uploader.close() == 0
    remote = [json.loads(line)["shard"]
              for line in (dest.get_bytes("manifest.jsonl") or b"").splitlines()]
    assert remote == [0, 2]  # the earlier run's entry kept, each listed after its object
    fresh = tmp_path / "elsewhere"
    assert restore_from(dest, fresh) == 2  # the resume regenerates shard 1 only
    assert Manifest(fresh).committed().keys() == {0, 2}
    assert prepare_job(Path(Manifest(fresh).load_plan().input_path), fresh, 4).pending == [1]
