"""Telemetry: what the sampler records, and a throttling GPU (a fake NVML) as a warning."""

import mmap

from harness.metrics.telemetry import Nvml, Series, Telemetry, summarize


class FakeNvml(Nvml):
    """A GPU that reports a hardware thermal slowdown on its second sample."""

    def __init__(self):
        self.absent = None
        self.calls = 0

    def sample(self):
        self.calls += 1
        reasons = 0x40 if self.calls == 2 else 0
        return [
            {
                "util_pct": 90.0,
                "mem_bw_util_pct": 40.0,
                "mem_used_bytes": 2e9,
                "power_w": 300.0,
                "temp_c": 70.0 + self.calls,
                "sm_clock_mhz": 1980.0 - 100 * (self.calls == 2),
                "throttle_reasons": float(reasons),
            }
        ]


def test_cpu_and_memory_of_the_work_are_seen():
    sampler = Telemetry(interval_s=0.05)
    sampler.start()
    # 80 MiB of fresh anonymous pages, every page written: RSS grows by them whatever the
    # allocator kept from earlier tests in this worker (2 x 40 MiB of np.ones once read
    # an RSS drift of exactly 0 in the whole suite, and never alone)
    keep = mmap.mmap(-1, 80 * 2**20)
    for offset in range(0, len(keep), mmap.PAGESIZE):
        keep[offset] = 1
    x = 0.0
    for i in range(3_000_000):  # ~0.3 s of pure-Python CPU work
        x += i
    out = sampler.stop()
    assert sampler.stop() is out  # idempotent
    assert len(out["series"]["t"]) >= 3
    assert out["summary"]["rss_drift_bytes"] >= 64 * 2**20, out["series"]["rss_bytes"]
    assert out["summary"]["cpu_user_pct_mean"] > 10
    assert len(out["series"]["cpu_user_pct"]) == len(out["series"]["t"]) - 1
    keep.close()


def test_the_gpu_part_is_a_device_table_or_absent_with_the_reason():
    sampler = Telemetry(interval_s=1.0)
    sampler.start()
    result = sampler.stop()
    if sampler.nvml.absent:  # a CPU machine: not an error, recorded as absent
        assert result["gpu"] == {"absent": sampler.nvml.absent}
        assert result["warnings"] == []
    else:
        assert "util_pct_mean" in result["gpu"]["0"]["summary"]


def test_a_throttled_gpu_becomes_a_warning_with_its_reason():
    series = Series()
    nvml = FakeNvml()
    for t in (0.0, 0.5, 1.0):
        series.t.append(t)
        series.host.append(
            {"cpu_user_s": t, "cpu_system_s": 0.0, "rss_bytes": 1e8, "system_cpu_pct": 50.0}
        )
        series.gpu.append(nvml.sample())
    out = summarize(series, 0.5, None)
    assert out["warnings"] == [
        "the GPU throttled during the cell (hardware thermal slowdown); its figures are not a"
        " steady clock's"
    ]
    gpu = out["gpu"]["0"]
    assert gpu["summary"]["sm_clock_mhz_min"] == 1880.0
    assert gpu["series"]["temp_c"] == [71.0, 72.0, 73.0]
    assert out["summary"]["cpu_user_pct_mean"] == 100.0
