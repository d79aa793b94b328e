"""Where a job writes, checked before it starts: a real S3 endpoint (moto's server) and real
folders (infra/locations.py)."""

from __future__ import annotations

from pathlib import Path

from infra.locations import bucket_problem, local_folder_problem


def test_a_bucket_is_checked_with_one_request(s3_endpoint: str, bucket: str) -> None:
    assert bucket_problem(f"s3://{bucket}/run", "output", s3_endpoint, None) is None
    missing = bucket_problem("s3://no-such-bucket/run", "upload_to", s3_endpoint, None)
    assert missing is not None and missing.startswith("upload_to: bucket 'no-such-bucket' "
                                                      "does not exist")
    down = bucket_problem(f"s3://{bucket}/run", "output", "http://127.0.0.1:9", None, 2.0)
    assert down is not None and "cannot reach endpoint http://127.0.0.1:9" in down


def test_folders(tmp_path: Path) -> None:
    afile = tmp_path / "f"
    afile.write_text("x")
    assert local_folder_problem(tmp_path / "new" / "deeper", "output") is None
    assert "is a file" in (local_folder_problem(afile, "output") or "")
    assert "which is a file" in (local_folder_problem(afile / "sub", "output") or "")
