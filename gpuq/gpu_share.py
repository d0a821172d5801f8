"""Shares of GPUs: what part of a device a MIG slice, a time-sliced replica or a KAI fraction is.
Pure; shared by the collector (which bills a pod its share) and the accounting (which counts MIG
slices as slices and weighs idle time by share), which may not import each other.

Unit
    Shares are **milli-GPUs** (integer thousandths, the ledger's unit: ``accounting.model``).
    Every share here is a rational number of GPUs (``N/7`` of a GPU, ``1/replicas``, a KAI
    fraction) rounded **down** to the thousandth (:func:`milli_floor`): the shares held on one
    device then never add up to more than the device, since a sum of floors is at most the floor
    of the sum. Rounding to the nearest thousandth would bill seven 1g slices of an A100
    ``7 x 0.143 = 1.001`` GPUs; rounded down they bill ``7 x 0.142 = 0.994``. Sums over a whole are
    computed before rounding where the whole is known (a node's 56 slices of 1/7 are 8 GPUs, not
    ``56 x 0.142``; a pod holding two 1g slices is ``floor(2000/7) = 285``).

MIG (:data:`MIG_GPUS`, :func:`mig_fraction`)
    A profile ``<N>g.<M>gb`` holds ``N`` of the GPU's compute slices, and its fraction of the GPU
    is ``N / S``, ``S`` the GPU's compute slices: NVIDIA's *MIG User Guide* ("Supported MIG
    Profiles": the *Fraction of SMs* column, e.g. A100-SXM4-40GB ``1g.5gb`` 1/7, ``3g.20gb`` 3/7;
    "Supported GPUs": *Max Number of Instances*) gives ``S`` = 7 for the A100, H100, H20, H200,
    GH200, B200, GB200 and B300, 4 for the A30 and the RTX PRO 6000 Blackwell, 2 for the RTX PRO
    5000/4500 Blackwell; no GPU has 8 compute slices (the A100 has 8 *memory* slices, which a
    profile's memory counts in: ``1g.10gb`` of an A100 40GB is 1/7 of its SMs and 2/8 of its
    memory). Billing follows compute: ``1g.20gb`` of an H100 is 1/7 like ``1g.10gb``. The profile
    names of each GPU are those of the guide's tables and of NVIDIA mig-parted's default
    configuration (``deployments/systemd/config-default.yaml``); a GPU is recognised by its
    product name (GFD's ``nvidia.com/gpu.product`` or DCGM's ``modelName``), and the same profile
    name can mean different fractions on different GPUs (``1g.24gb`` is 1/7 of an H100 NVL and
    1/4 of an RTX PRO 6000), so the GPU is looked up first. A GPU this table does not know is
    taken to have 7 compute slices (every MIG GPU NVIDIA lists but the A30 and the RTX PRO cards).

Time-slicing and MPS (:func:`replicas`)
    NVIDIA's device plugin advertises each GPU ``replicas`` times and GFD labels the node
    ``nvidia.com/<resource>.replicas`` (``nvidia.com/gpu.replicas``; with ``renameByDefault`` the
    resource is ``nvidia.com/gpu.shared``, labelled the same). A request of ``k`` replicas is
    ``k / replicas`` of a GPU (of the node's replicas, as it takes them from everyone else; the
    plugin does not give a pod of two replicas more compute), and the node holds ``allocatable /
    replicas`` GPUs.

KAI fractions (:func:`kai_fraction_milli`)
    KAI-Scheduler's ``gpu-fraction`` annotation (``"0.25"``: a quarter of one GPU), times
    ``gpu-fraction-num-devices`` (several devices, each that fraction); ``gpu-memory`` (MiB)
    becomes a fraction as KAI computes it (``pkg/scheduler/api/node_info``): ``ceil(memory /
    node memory x 100) / 100``, the node's ``nvidia.com/gpu.memory`` label rounded down to a
    multiple of 100 MiB (a value of 1 TiB or more is in bytes, GFD issue 26).
"""
from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction

MILLI = 1000
GPU_RESOURCE = "nvidia.com/gpu"
SHARED_SUFFIX = ".shared"
SHARED_GPU_RESOURCE = GPU_RESOURCE + SHARED_SUFFIX   # time-sliced replicas with renameByDefault: true
MIG_PREFIX = "nvidia.com/mig-"
KAI_FRACTION = "gpu-fraction"                       # KAI-Scheduler's annotations (pkg/common/constants)
KAI_MEMORY = "gpu-memory"
KAI_DEVICES = "gpu-fraction-num-devices"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"

# a profile: compute slices, memory, then options (``+me``, ``+gfx``, ``+me.all``, ``-me`` on Blackwell)
_PROFILE = re.compile(r"^(\d+)g\.\d+gb(?:[+-][a-z][a-z.]*)*$")
_MIG_MODEL = re.compile(r"^(.*)-MIG-(\d+g\.\d+gb(?:[+-][a-z][a-z.]*)*)$")
# a GPU type of MIG slices as the queue file declares it (``A100-mig-1g.10gb``) or as the nodes name
# them (``<product>-MIG-<profile>``)
_MIG_TYPE = re.compile(r"^(.+)-(?:mig|MIG)-(\d+g\.\d+gb(?:[+-][a-z][a-z.]*)*)$")


@dataclass(frozen=True, slots=True)
class MigGpu:
    """A MIG-capable GPU: how its product name reads, its compute slices, its profiles."""

    name: str
    match: tuple[str, ...]            # every one of these in the upper-cased, dashed product name
    slices: int                       # compute slices (S): a profile Ng is N/S of the GPU
    profiles: tuple[str, ...] = ()    # as the MIG User Guide and mig-parted name them


# First match wins (GB200 before B200, GH200 before H200, the H100 94/96 GB before the 80 GB one).
MIG_GPUS: tuple[MigGpu, ...] = (
    MigGpu("A30 24GB", ("A30",), 4, ("1g.6gb", "1g.6gb+me", "2g.12gb", "2g.12gb+me", "4g.24gb")),
    MigGpu("RTX PRO 6000 Blackwell", ("RTX-PRO-6000",), 4, ("1g.24gb", "2g.48gb", "4g.96gb")),
    MigGpu("RTX PRO 5000 Blackwell", ("RTX-PRO-5000",), 2),
    MigGpu("RTX PRO 4500 Blackwell", ("RTX-PRO-4500",), 2),
    MigGpu("GB200", ("GB200",), 7, ("1g.23gb", "1g.23gb+me", "1g.47gb", "2g.47gb", "3g.93gb", "4g.93gb",
                                    "7g.186gb")),
    MigGpu("B200", ("B200",), 7, ("1g.23gb", "1g.23gb+me", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb",
                                  "7g.180gb")),
    MigGpu("GH200", ("GH200",), 7),
    MigGpu("H200 141GB", ("H200",), 7, ("1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb",
                                        "7g.141gb")),
    MigGpu("H100 94GB (NVL)", ("H100", "NVL"), 7, ("1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb",
                                                   "4g.47gb", "7g.94gb")),
    MigGpu("H100 96GB", ("H100", "96GB"), 7, ("1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.48gb",
                                              "4g.48gb", "7g.96gb")),
    MigGpu("H100 80GB", ("H100",), 7, ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb",
                                       "7g.80gb")),
    MigGpu("H20", ("H20",), 7),
    MigGpu("A100 40GB", ("A100", "40GB"), 7, ("1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb",
                                              "7g.40gb")),
    MigGpu("A100 80GB", ("A100", "80GB"), 7, ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb",
                                              "7g.80gb")),
    MigGpu("B300", ("B300",), 7),
)
DEFAULT_SLICES = 7


def milli_floor(gpus: Fraction) -> int:
    """GPUs (exact) to milli-GPUs, rounded down (see the module docstring)."""
    return math.floor(gpus * MILLI)


@functools.lru_cache(maxsize=1024)
def mig_gpu(product: str) -> MigGpu | None:
    """The table's GPU for a product name (``NVIDIA-A100-SXM4-80GB``, ``NVIDIA A100-SXM4-80GB``)."""
    name = base_model(product).upper().replace(" ", "-")
    return next((g for g in MIG_GPUS if all(m in name for m in g.match)), None)


def base_model(product: str) -> str:
    """A product name without GFD's ``-SHARED`` and ``-MIG-<profile>`` suffixes."""
    product = product.removesuffix("-SHARED")
    m = _MIG_MODEL.match(product)
    return m.group(1) if m else product


def mig_profile_of(model: str) -> str:
    """The MIG profile a model names (``NVIDIA-A100-SXM4-40GB-MIG-1g.5gb[-SHARED]``), else ``""``."""
    m = _MIG_MODEL.match(model.removesuffix("-SHARED"))
    return m.group(2) if m else ""


def mig_type_parts(name: str) -> tuple[str, str] | None:
    """``(base, profile)`` of a MIG type's name (``A100-mig-1g.10gb`` -> ``("A100", "1g.10gb")``,
    ``NVIDIA-A100-SXM4-80GB-MIG-1g.10gb`` likewise), None for any other name."""
    m = _MIG_TYPE.match(name.removesuffix("-SHARED"))
    return (m.group(1), m.group(2)) if m else None


@functools.lru_cache(maxsize=4096)
def mig_fraction(product: str, profile: str) -> Fraction:
    """The fraction of its GPU a MIG profile is (``N/S``). ValueError for a name that is not a
    profile, or one with more compute slices than its GPU has."""
    m = _PROFILE.match(profile)
    if not m:
        raise ValueError(f"not a MIG profile: {profile!r}")
    gpu = mig_gpu(product)
    slices = gpu.slices if gpu else DEFAULT_SLICES
    n = int(m.group(1))
    if not 0 < n <= slices:
        raise ValueError(f"MIG profile {profile!r} has {n} compute slices; {gpu.name if gpu else product!r} has {slices}")
    return Fraction(n, slices)


@functools.lru_cache(maxsize=4096)
def mig_slice_milli(model: str) -> int:
    """Milli-GPUs one slice of a MIG model (``<product>-MIG-<profile>``) is; 0 for another model or
    a profile that cannot be read."""
    profile = mig_profile_of(model)
    if not profile:
        return 0
    try:
        return milli_floor(mig_fraction(base_model(model), profile))
    except ValueError:
        return 0


def counted_milli(model: str, milli: int) -> int:
    """What ``milli`` billed milli-GPUs of ``model`` count against capacity and quotas, where MIG
    slices are counted as slices (1000 a slice, as the nodes' ``<model>-MIG-<profile>`` capacity
    and the scheduler count them): ``k`` whole slices when ``milli == floor(k x N/S x 1000)`` (each
    slice is at least 1/8 of a GPU, so ``k`` is unique), else the part of a slice it is (a
    time-sliced MIG device); ``milli`` itself for any other model."""
    profile = mig_profile_of(model)
    if not profile or milli <= 0:
        return milli
    try:
        fraction = mig_fraction(base_model(model), profile)
    except ValueError:
        return milli
    k = math.ceil(Fraction(milli, MILLI) / fraction)
    if milli_floor(k * fraction) == milli:
        return k * MILLI
    return math.floor(Fraction(milli) / fraction)


def replicas(labels: Mapping[str, str], resource: str) -> int:
    """How many replicas the device plugin made of each device of ``resource`` on a node: the
    ``<resource>.replicas`` label GFD sets (``nvidia.com/gpu.shared`` reads ``nvidia.com/gpu``'s),
    1 when absent or unreadable."""
    key = resource.removesuffix(SHARED_SUFFIX) + ".replicas"
    try:
        n = int(labels.get(key, "1"))
    except ValueError:
        return 1
    return n if n > 0 else 1


def node_gpu_memory_mib(labels: Mapping[str, str]) -> int:
    """KAI's reading of a node's ``nvidia.com/gpu.memory``: MiB (bytes when 1 TiB or more), rounded
    down to a multiple of 100; 0 when absent or unreadable."""
    try:
        value = int(labels.get(GPU_MEMORY_LABEL, ""))
    except ValueError:
        return 0
    if value >= 1024 * 1024:
        value //= 1024 * 1024
    return max(0, value - value % 100)


def _decimal(text: str) -> Decimal | None:
    try:
        d = Decimal(text.strip())
    except (InvalidOperation, AttributeError):
        return None
    return d if d.is_finite() else None


def kai_fraction_milli(annotations: Mapping[str, str], node_labels: Mapping[str, str] | None = None) -> int | None:
    """Milli-GPUs a KAI-Scheduler fractional pod asks for, None when it asks for none (or the
    annotations cannot be read: KAI's admission refuses such a pod). ``gpu-memory`` needs the
    node's GPU memory: without it (a pod not yet bound) the share is None."""
    devices = 1
    if annotations.get(KAI_DEVICES):
        try:
            devices = int(annotations[KAI_DEVICES])
        except ValueError:
            return None
        if devices <= 0:
            return None
    if annotations.get(KAI_FRACTION):
        f = _decimal(annotations[KAI_FRACTION])
        if f is None or not 0 < f <= 1:
            return None
        return math.floor(f * devices * MILLI)
    if annotations.get(KAI_MEMORY):
        mem = _decimal(annotations[KAI_MEMORY])
        node_mem = node_gpu_memory_mib(node_labels or {})
        if mem is None or mem <= 0 or node_mem <= 0:
            return None
        hundredths = math.ceil(Fraction(mem) / node_mem * 100)
        return min(hundredths, 100) * 10 * devices
    return None


def device_share_milli(model: str, milli: int) -> int:
    """Milli-GPUs of one device (a GPU or a MIG instance, as DCGM names it) an allocation holds: a
    MIG slice's share, a share of one GPU as it is, a whole GPU 1000. An idle device counts this
    much idle for the allocation (``accounting.idle``)."""
    return mig_slice_milli(model) or min(milli, MILLI)


def shares_a_device(model: str, milli: int) -> bool:
    """Holds part of a GPU that others may hold too (not a MIG slice, not whole GPUs)."""
    return milli % MILLI != 0 and not mig_slice_milli(model)
