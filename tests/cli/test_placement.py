"""Placement of engines on GPUs (cli/placement.py): tables of pools and devices, and the refusals."""

from __future__ import annotations

import pytest

from cli.placement import (
    PlacementError,
    PoolDemand,
    control_plane_env,
    parse_devices,
    parse_nvidia_smi_list,
    place,
)

EIGHT = tuple(range(8))


@pytest.mark.parametrize(("devices", "pools", "expected"), [
    # 8 GPUs as 2 prefill TP2 + 4 decode TP1: the TP pairs take aligned neighbours first.
    (EIGHT, [PoolDemand("prefill", 2, tensor_parallel=2), PoolDemand("decode", 4)],
     [("prefill", "0,1", None), ("prefill", "2,3", None), ("decode", "4", None), ("decode", "5", None),
      ("decode", "6", None), ("decode", "7", None)]),
    # Decode's TP2 listed second still gets the aligned pairs; the single prefill engines fill after them.
    (EIGHT[:6], [PoolDemand("prefill", 2), PoolDemand("decode", 2, tensor_parallel=2)],
     [("prefill", "4", None), ("prefill", "5", None), ("decode", "0,1", None), ("decode", "2,3", None)]),
    # TP x PP: 2 x 2 is four devices.
    (EIGHT, [PoolDemand("prefill", 1, tensor_parallel=2, pipeline_parallel=2), PoolDemand("decode", 1)],
     [("prefill", "0,1,2,3", None), ("decode", "4", None)]),
    # 1 GPU as 1P + 1D: both on device 0, each with 0.45 of its memory.
    ((0,), [PoolDemand("prefill", 1), PoolDemand("decode", 1)], [("prefill", "0", 0.45), ("decode", "0", 0.45)]),
    # The user's own fraction wins (and is in their arguments already: none added); the other gets the share.
    ((0,), [PoolDemand("prefill", 1, gpu_memory_utilization=0.3), PoolDemand("decode", 1)],
     [("prefill", "0", None), ("decode", "0", 0.45)]),
    # 3 engines on 2 GPUs dealt round-robin: GPU 0 holds two (0.45 each), GPU 1 one (0.9).
    ((2, 5), [PoolDemand("prefill", 1), PoolDemand("decode", 2)],
     [("prefill", "2", 0.45), ("decode", "5", 0.9), ("decode", "2", 0.45)]),
    # Devices given as a list keep their ids; spares stay unused.
    ((1, 3, 6), [PoolDemand("both", 2)], [("both", "1", None), ("both", "3", None)]),
])
def test_each_engine_gets_its_devices(devices, pools, expected) -> None:
    placement = place(devices, pools)
    assert [(e.role, e.cuda_visible_devices, e.gpu_memory_utilization) for e in placement.engines] == expected
    assert placement.shared == any(f is not None for _, _, f in expected)


@pytest.mark.parametrize(("devices", "pools", "message"), [
    ((0, 1), [PoolDemand("prefill", 1, tensor_parallel=4)], "one engine needs 4 GPUs"),
    ((0,), [PoolDemand("prefill", 1, tensor_parallel=2), PoolDemand("decode", 1)], "one engine needs 2 GPUs"),
    # Too many engines of mixed sizes: sharing needs one size.
    ((0, 1, 2), [PoolDemand("prefill", 1, tensor_parallel=2), PoolDemand("decode", 2)], "need 4 GPUs, only 3"),
    # Uneven: TP2 engines sharing 3 devices.
    ((0, 1, 2), [PoolDemand("prefill", 2, tensor_parallel=2)], "uneven, 3 is not a multiple of 2"),
    ((0,), [PoolDemand("prefill", 1, tensor_parallel=0)], "at least 1 x 1"),
    ((0,), [PoolDemand("prefill", 1, gpu_memory_utilization=0.8), PoolDemand("decode", 1)], "ask for 1.25"),
    ((), [PoolDemand("prefill", 1)], "no GPU"),
])
def test_refusals_say_why(devices, pools, message) -> None:
    with pytest.raises(PlacementError, match=message.replace("(", r"\(").replace(".", r"\.")):
        place(devices, pools)


@pytest.mark.parametrize(("text", "available", "expected"), [
    ("0-7", None, EIGHT),
    ("0,1,3", None, (0, 1, 3)),
    ("2,4-5", (0, 1, 2, 3, 4, 5), (2, 4, 5)),
    ("all", (0, 1), (0, 1)),
    (" 3 ", None, (3,)),
])
def test_device_lists(text, available, expected) -> None:
    assert parse_devices(text, available) == expected


@pytest.mark.parametrize(("text", "available", "message"), [
    ("0-7", (0,), "no device 1, 2, 3, 4, 5, 6, 7 on this machine"),
    ("a", None, "'a' is not a device id"),
    ("3-1", None, "runs backwards"),
    ("0,0", None, "named twice"),
    ("0,", None, "'' is not a device id"),
    ("all", None, "no GPU found"),
    ("all", (), "lists no GPU"),
])
def test_bad_device_lists(text, available, message) -> None:
    with pytest.raises(PlacementError, match=message):
        parse_devices(text, available)


def test_nvidia_smi_list() -> None:
    out = ("GPU 0: NVIDIA H200 (UUID: GPU-1b2c)\n"
           "GPU 1: NVIDIA H200 (UUID: GPU-3d4e)\n"
           "  MIG 1g.18gb     Device  0: (UUID: MIG-5f6a)\n")
    assert parse_nvidia_smi_list(out) == (0, 1)
    assert parse_nvidia_smi_list("") == ()


@pytest.mark.parametrize(("service", "expected"), [
    ("router", {"CUDA_VISIBLE_DEVICES": ""}), ("frontend", {"CUDA_VISIBLE_DEVICES": ""}),
    ("kvtier", {"CUDA_VISIBLE_DEVICES": ""}), ("planner", {"CUDA_VISIBLE_DEVICES": ""}), ("worker", {}),
])
def test_control_plane_sees_no_gpu(service, expected) -> None:
    assert control_plane_env(service) == expected
