"""Reading fingerprints back: which machine, and which fields differ."""

from __future__ import annotations

from harness.results import environment
from harness.results.environment import fingerprint as take

GPU_BOX = {
    "cpu": {"model": "Xeon", "logical_cores": 32, "affinity": 32, "max_mhz": 3000.0},
    "memory_bytes": 256 * 2**30 + 5 * 2**20,
    "gpu": {
        "present": True,
        "driver": "580.1",
        "devices": [
            {"index": 0, "name": "NVIDIA H200", "memory_bytes": 141 * 2**30},
            {"index": 1, "name": "NVIDIA H200", "memory_bytes": 141 * 2**30},
        ],
    },
    "packages": {"onnxruntime": "1.20.0", "numpy": "2.0"},
    "git": {"commit": "a", "dirty": False},
    "hostname": "node-1",
}


def test_flatten_names_nested_fields_and_list_items():
    flat = environment.flatten(GPU_BOX)
    assert flat["cpu.model"] == "Xeon"
    assert flat["gpu.devices.1.name"] == "NVIDIA H200"
    assert flat["memory_gib"] == 256  # a few MiB of kernel noise round away


def test_hardware_is_cpu_gpus_and_memory_only():
    hw = environment.hardware(GPU_BOX)
    assert hw == {
        "cpu.affinity": 32,
        "cpu.logical_cores": 32,
        "cpu.model": "Xeon",
        "gpu.devices.0.memory_bytes": 141 * 2**30,
        "gpu.devices.0.name": "NVIDIA H200",
        "gpu.devices.1.memory_bytes": 141 * 2**30,
        "gpu.devices.1.name": "NVIDIA H200",
        "memory_gib": 256,
    }
    assert environment.hardware_label(GPU_BOX) == "Xeon x32, 2x NVIDIA H200, 256 GiB"
    assert environment.hardware_label({}) == "unknown hardware"


def test_differences_leave_out_code_and_host_and_honour_allow_patterns():
    other = {
        **GPU_BOX,
        "hostname": "node-2",
        "git": {"commit": "b", "dirty": True},
        "packages": {"onnxruntime": "1.21.0", "numpy": "2.0"},
        "cpu": {**GPU_BOX["cpu"], "model": "EPYC"},
    }
    assert environment.differences(GPU_BOX, other) == ["cpu.model", "packages.onnxruntime"]
    assert environment.differences(GPU_BOX, other, allow=["packages.*"]) == ["cpu.model"]
    assert environment.describe_differences(GPU_BOX, other, ["cpu.model"]) == [
        "cpu.model: 'Xeon' != 'EPYC'"
    ]


def test_a_field_present_on_one_side_only_is_a_difference():
    fewer = {**GPU_BOX, "gpu": {"present": False, "reason": "no NVML"}}
    diff = environment.differences(GPU_BOX, fewer)
    assert "gpu.devices.0.name" in diff
    assert "gpu.present" in diff
    line = environment.describe_differences(GPU_BOX, fewer, ["gpu.devices.0.name"])[0]
    assert line == "gpu.devices.0.name: 'NVIDIA H200' != '(absent)'"


def test_this_machines_fingerprint_has_a_hardware_label():
    env = take()
    assert environment.differences(env, env) == []
    assert "GiB" in environment.hardware_label(env)
