"""Shares of GPUs (gpuq.gpu_share): the MIG profile table, rounding, replicas, KAI fractions."""
from __future__ import annotations

import itertools
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuq.gpu_share import (
    MIG_GPUS,
    counted_milli,
    device_share_milli,
    kai_fraction_milli,
    mig_fraction,
    mig_gpu,
    mig_slice_milli,
    milli_floor,
    node_gpu_memory_mib,
    replicas,
    shares_a_device,
)


@pytest.mark.parametrize("product, profile, fraction", [
    ("NVIDIA-A100-SXM4-40GB", "1g.5gb", Fraction(1, 7)),
    ("NVIDIA-A100-SXM4-40GB", "1g.10gb", Fraction(1, 7)),          # 2/8 of the memory, 1/7 of the SMs
    ("NVIDIA-A100-SXM4-40GB", "3g.20gb", Fraction(3, 7)),
    ("NVIDIA-A100-SXM4-80GB", "1g.10gb", Fraction(1, 7)),
    ("NVIDIA A100 80GB PCIe", "4g.40gb", Fraction(4, 7)),           # DCGM's modelName spelling
    ("NVIDIA-H100-80GB-HBM3", "1g.10gb", Fraction(1, 7)),
    ("NVIDIA-H100-80GB-HBM3", "1g.20gb", Fraction(1, 7)),
    ("NVIDIA-H100-NVL", "1g.24gb", Fraction(1, 7)),
    ("NVIDIA-H200", "7g.141gb", Fraction(1)),
    ("NVIDIA-GB200", "2g.47gb", Fraction(2, 7)),
    ("NVIDIA-A30", "1g.6gb", Fraction(1, 4)),
    ("NVIDIA-A30", "2g.12gb+me", Fraction(1, 2)),
    ("NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition", "1g.24gb", Fraction(1, 4)),   # same name as the H100 NVL's
    ("Some-Future-GPU", "3g.60gb", Fraction(3, 7)),                 # unknown GPU: 7 compute slices
], ids=lambda v: str(v))
def test_a_profile_is_its_compute_slices_over_the_gpus(product: str, profile: str, fraction: Fraction) -> None:
    assert mig_fraction(product, profile) == fraction


def test_the_table_names_each_gpu_once_and_every_profile_fits_its_gpu() -> None:
    for gpu in MIG_GPUS:
        assert mig_gpu("NVIDIA-" + "-".join(gpu.match)) is not None
        for profile in gpu.profiles:
            n = int(profile.split("g.")[0])
            assert 0 < n <= gpu.slices and mig_fraction("-".join(gpu.match), profile) == Fraction(n, gpu.slices)
    assert mig_gpu("NVIDIA-GH200-480GB").name == "GH200"             # not taken for an H200
    assert mig_gpu("NVIDIA-H100-NVL").name.startswith("H100 94GB")
    assert mig_gpu("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb-SHARED").name == "A100 80GB"


@pytest.mark.parametrize("profile", ["8g.80gb", "1g", "gpu", "0g.5gb"])
def test_what_is_not_a_profile_of_the_gpu_is_refused(profile: str) -> None:
    with pytest.raises(ValueError, match="MIG profile"):
        mig_fraction("NVIDIA-A100-SXM4-80GB", profile)


def test_thousandths_are_rounded_down_so_the_slices_of_a_gpu_never_exceed_it() -> None:
    one = mig_slice_milli("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb")
    assert one == 142 and 7 * one == 994            # rounded to nearest, 7 x 143 would be 1001
    # every way to fill a GPU of 7 compute slices with 1g..4g and 7g slices stays within it
    for combo in itertools.product(range(8), repeat=4):
        slices = combo[0] * 1 + combo[1] * 2 + combo[2] * 3 + combo[3] * 4
        if slices <= 7:
            billed = sum(n * milli_floor(Fraction(s, 7)) for n, s in zip(combo, (1, 2, 3, 4)))
            assert billed <= 1000
    # a whole is computed before rounding: 56 slices of 1/7 are 8 GPUs
    assert milli_floor(56 * Fraction(1, 7)) == 8000


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([(g, p) for g in MIG_GPUS for p in g.profiles]), st.integers(1, 64))
def test_counted_slices_are_read_back_from_the_billed_share(gpu_profile: tuple[Any, str], k: int) -> None:
    gpu, profile = gpu_profile
    model = f"NVIDIA-{'-'.join(gpu.match)}-MIG-{profile}"
    billed = milli_floor(k * mig_fraction(model.rpartition("-MIG-")[0], profile))
    assert counted_milli(model, billed) == 1000 * k
    assert device_share_milli(model, billed) == mig_slice_milli(model)
    assert not shares_a_device(model, billed)


def test_counted_is_the_share_for_anything_but_mig() -> None:
    assert counted_milli("NVIDIA-A100-SXM4-80GB", 250) == 250
    assert counted_milli("Tesla-T4-SHARED", 333) == 333
    assert device_share_milli("NVIDIA-A100-SXM4-80GB", 4000) == 1000      # each of its GPUs whole
    assert device_share_milli("Tesla-T4-SHARED", 333) == 333
    assert shares_a_device("Tesla-T4-SHARED", 333) and not shares_a_device("NVIDIA-A100-SXM4-80GB", 2000)
    # a time-sliced MIG device: a replica of a 1g slice counts that part of the slice
    assert counted_milli("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", milli_floor(Fraction(1, 7) / 2)) == 497


@pytest.mark.parametrize("labels, resource, n", [
    ({"nvidia.com/gpu.replicas": "4"}, "nvidia.com/gpu", 4),
    ({"nvidia.com/gpu.replicas": "4"}, "nvidia.com/gpu.shared", 4),        # renameByDefault: same label
    ({"nvidia.com/mig-1g.10gb.replicas": "2"}, "nvidia.com/mig-1g.10gb", 2),
    ({}, "nvidia.com/gpu", 1),
    ({"nvidia.com/gpu.replicas": "x"}, "nvidia.com/gpu", 1),
    ({"nvidia.com/gpu.replicas": "0"}, "nvidia.com/gpu", 1),
])
def test_replicas(labels: dict[str, str], resource: str, n: int) -> None:
    assert replicas(labels, resource) == n


@pytest.mark.parametrize("annotations, labels, milli", [
    ({"gpu-fraction": "0.25"}, {}, 250),
    ({"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"}, {}, 1000),
    ({"gpu-fraction": "0.3333"}, {}, 333),
    # KAI: ceil(memory / node memory x 100) / 100, the node's memory rounded down to 100 MiB
    ({"gpu-memory": "2000"}, {"nvidia.com/gpu.memory": "81920"}, 30),
    ({"gpu-memory": "40950"}, {"nvidia.com/gpu.memory": "81920"}, 500),
    ({"gpu-memory": "2000"}, {"nvidia.com/gpu.memory": str(81920 * 1024 * 1024)}, 30),   # GFD's bytes
    ({"gpu-memory": "2000"}, {}, None),                # no node yet: unknown
    ({"gpu-fraction": "1.5"}, {}, None), ({"gpu-fraction": "x"}, {}, None), ({"gpu-fraction": "0"}, {}, None),
    ({"gpu-fraction": "0.5", "gpu-fraction-num-devices": "0"}, {}, None),
    ({}, {}, None),
])
def test_kai_fractions(annotations: dict[str, str], labels: dict[str, str], milli: int | None) -> None:
    assert kai_fraction_milli(annotations, labels) == milli


def test_node_gpu_memory() -> None:
    assert node_gpu_memory_mib({"nvidia.com/gpu.memory": "81920"}) == 81900
    assert node_gpu_memory_mib({"nvidia.com/gpu.memory": "nope"}) == 0
