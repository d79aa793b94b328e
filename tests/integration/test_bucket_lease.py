"""The output's lease in a bucket prefix (infra/bucket_lease.py) on a real S3 endpoint (moto's
server mode): hosts that share only the bucket see one another, exactly one of two racing
runs wins, a lapsed owner elsewhere is taken over by the store's clock, and an owner whose
bucket lease was taken stops at its next commit."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path

import boto3
import pytest

from infra import lease
from infra.bucket_lease import BucketLease, leases_beside
from infra.lease import (
    FolderLease,
    LeaseLost,
    OutputInUse,
    Owner,
    StoreUnreachable,
    acquire,
    check_owned,
    held_lease,
    in_use_problem,
    owner_json,
    read_owner,
    this_process,
)
from infra.storage import S3Destination, S3Patience
from tests.conftest import free_port_block


def store(endpoint: str, bucket: str, prefix: str = "job") -> BucketLease:
    [found] = leases_beside(f"s3://{bucket}/{prefix}", endpoint, None)
    assert isinstance(found, BucketLease)
    return found


def elsewhere(renewed_ago_s: float = 0.0) -> Owner:
    now = time.time()
    return Owner("gpu-node-17", 4242, 1, "their-run", now - 600, now - renewed_ago_s)


def put_owner(endpoint: str, bucket: str, owner: Owner, key: str = "job/lease.json") -> None:
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").put_object(
        Bucket=bucket, Key=key, Body=owner_json(owner))


def test_a_live_owner_on_another_host_is_named_and_no_second_lease_is_written(
        s3_endpoint: str, bucket: str) -> None:
    put_owner(s3_endpoint, bucket, elsewhere())
    with pytest.raises(OutputInUse, match=rf"s3://{bucket}/job/lease.json is in use by a live "
                                          r"run \(flow run 'their-run', pid 4242 on "
                                          r"gpu-node-17, .*--force-takeover"):
        acquire(store(s3_endpoint, bucket))
    assert in_use_problem(store(s3_endpoint, bucket)) is not None
    held = read_owner(store(s3_endpoint, bucket))
    assert held is not None and (held.host, held.pid) == ("gpu-node-17", 4242)


def test_the_lapse_is_read_on_the_stores_clock_not_the_owners(
        s3_endpoint: str, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lease, "LAPSE_S", 2.0)
    # its own clock says it renewed just now (an hour ahead of ours); the bucket says when
    put_owner(s3_endpoint, bucket, replace(elsewhere(), renewed_at=time.time() + 3600))
    assert in_use_problem(store(s3_endpoint, bucket)) is not None
    time.sleep(3.1)  # Last-Modified has whole seconds
    assert in_use_problem(store(s3_endpoint, bucket)) is None
    assert acquire(store(s3_endpoint, bucket)) is True
    held = read_owner(store(s3_endpoint, bucket))
    assert held is not None and held.same_process(this_process())


def test_of_two_runs_that_race_for_a_free_prefix_exactly_one_wins(
        s3_endpoint: str, bucket: str) -> None:
    wins: list[bool] = []
    start = threading.Barrier(8)

    def race() -> None:
        start.wait()
        wins.append(store(s3_endpoint, bucket).create(elsewhere()))

    threads = [threading.Thread(target=race) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(wins) == [False] * 7 + [True]


def test_of_two_takers_of_one_lease_exactly_one_wins(s3_endpoint: str, bucket: str) -> None:
    put_owner(s3_endpoint, bucket, elsewhere())  # both read it (lapsed, or --force-takeover)
    found = store(s3_endpoint, bucket).read()
    assert found is not None
    me = this_process()
    first = store(s3_endpoint, bucket).take(found, me)
    second = store(s3_endpoint, bucket).take(found, replace(me, pid=me.pid + 1))
    assert (first, second) == (True, False)


def test_an_owner_whose_bucket_lease_was_taken_stops_at_its_next_commit(
        tmp_path: Path, s3_endpoint: str, bucket: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lease, "RENEW_S", 0.1)
    with held_lease(tmp_path, "first", beside=[store(s3_endpoint, bucket)]):
        check_owned(tmp_path)
        time.sleep(0.3)  # renewed: still ours
        check_owned(tmp_path)
        put_owner(s3_endpoint, bucket, elsewhere())  # --force-takeover on another host
        deadline = time.monotonic() + 10
        with pytest.raises(LeaseLost, match=rf"s3://{bucket}/job/lease.json: this run's lease "
                                            r"is now held by flow run 'their-run', pid 4242"):
            while time.monotonic() < deadline:
                check_owned(tmp_path)
                time.sleep(0.05)
    assert read_owner(store(s3_endpoint, bucket)) is not None  # the taker's, left alone
    assert FolderLease(tmp_path).read() is None  # ours, released at the body's end


def test_both_leases_are_released_at_the_end_and_a_refusal_takes_neither(
        tmp_path: Path, s3_endpoint: str, bucket: str) -> None:
    with held_lease(tmp_path / "a", "mine", beside=[store(s3_endpoint, bucket)]):
        assert read_owner(store(s3_endpoint, bucket)) is not None
    assert read_owner(store(s3_endpoint, bucket)) is None
    put_owner(s3_endpoint, bucket, elsewhere())
    with pytest.raises(OutputInUse), held_lease(tmp_path / "b", "second",
                                                beside=[store(s3_endpoint, bucket)]):
        pass
    assert FolderLease(tmp_path / "b").read() is None  # the folder's lease was given back
    held = read_owner(store(s3_endpoint, bucket))
    assert held is not None and held.pid == 4242  # the live owner's, untouched


def test_an_endpoint_that_does_not_answer_is_unreachable_not_free(bucket: str) -> None:
    dead = f"http://127.0.0.1:{free_port_block(1)}"
    quiet = BucketLease(S3Destination(bucket, "job", dead, patience=S3Patience(
        connect_timeout_s=0.5, read_timeout_s=0.5, attempts=1)))
    with pytest.raises(StoreUnreachable, match=f"s3://{bucket}/job/lease.json"):
        quiet.read()
