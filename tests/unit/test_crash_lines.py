"""SGLang's crash lines, read from real logs (infra/sglang/crash_lines.py)."""

from __future__ import annotations

import gzip
from pathlib import Path

from infra.sglang.crash_lines import crash_lines, died, main_cause

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "tests" / "fixtures" / "sglang-samples" / "crash-first-batch-0.5.17.log"
KIMI_OOM = ROOT / "bench" / "real_sglang" / "data" / "2026-12-03-h200-s16" / (
    "moe_d-kimi_nb_bf16.log.gz")


def test_the_real_first_batch_crash_is_its_two_key_lines() -> None:
    """289 lines, 20 identical device-side asserts (192 on the device), a traceback: the
    assert once, counted, and the CUBLAS error the traceback ends in."""
    lines = crash_lines(SAMPLE.read_text())
    assert len(lines) == 2
    assert "vectorized gather kernel index out of bounds" in lines[0].text
    assert lines[0].count == 20 and str(lines[0]).endswith("(×20)")
    assert lines[1].text.startswith("RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED")
    assert main_cause(lines) == "kernel_fault" and died(SAMPLE.read_text())


def test_a_cuda_oom_at_run_time_is_told_from_a_kernel_fault() -> None:
    """Kimi-Linear with a cap past its CUDA graphs, on the H200: the eager batch's attention
    buffer did not fit (session 16)."""
    text = gzip.decompress(KIMI_OOM.read_bytes()).decode()
    lines = crash_lines(text)
    assert [c.cause for c in lines] == ["out_of_memory"]
    assert lines[0].text.startswith("torch.OutOfMemoryError: CUDA out of memory.")
    assert main_cause(lines) == "out_of_memory"


def test_other_releases_spellings_and_a_healthy_log() -> None:
    old = ("[2024-11-02 10:00:01 TP0] Scheduler hit an exception: RuntimeError: CUDA error: "
           "an illegal memory access was encountered\n"
           "[2024-11-02 10:00:01] Received sigquit from a child process. It usually means the "
           "child failed.\n")
    assert [c.cause for c in crash_lines(old)] == ["kernel_fault"] and died(old)
    hang = "[2026-01-01 00:00:00] Watchdog timeout (self.watchdog_timeout=300)\n"
    assert main_cause(crash_lines(hang)) == "hang"
    healthy = ("[2026-12-03 13:52:18] Decode batch, #running-req: 72, gen throughput "
               "(token/s): 3381.78, #queue-req: 0\n")
    assert crash_lines(healthy) == [] and not died(healthy)
