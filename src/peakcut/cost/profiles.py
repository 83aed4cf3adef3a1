"""Device profiles for the analytic cost model: peak rates, bandwidths and overheads.

Every figure is a *dense* (non-sparse) vendor figure unless marked otherwise. Sources:

* **RTX 3090** (the MAGIS paper's GPU): NVIDIA Ampere GA102 GPU Architecture whitepaper,
  appendix table "GeForce RTX 3090" (82 SMs, 1695 MHz boost): FP32 35.6 TFLOPS; FP16 and BF16
  (non-tensor) 35.6 TFLOPS; FP16/BF16 tensor with FP32 accumulate 71 TFLOPS (GeForce parts run
  FP32-accumulate at half the FP16-accumulate rate; PyTorch accumulates in FP32); TF32 tensor
  35.6 TFLOPS; FP64 is 1/64 of FP32 (0.56 TFLOPS); GDDR6X 936 GB/s.
* **A100-80GB SXM**: NVIDIA A100 Tensor Core GPU datasheet: FP64 9.7, FP64 tensor 19.5, FP32
  19.5, TF32 tensor 156, BF16/FP16 tensor 312 TFLOPS; HBM2e 2,039 GB/s. Non-tensor FP16 78 and
  BF16 39 TFLOPS: NVIDIA A100 Tensor Core GPU Architecture whitepaper, table 1.
* **H100 SXM**: NVIDIA H100 Tensor Core GPU datasheet: FP64 34, FP64 tensor 67, FP32 67 TFLOPS;
  TF32 tensor 494.5, BF16/FP16 tensor 989.5 TFLOPS (the datasheet's sparse figures 989 / 1,979
  halved); HBM3 3.35 TB/s. Non-tensor FP16/BF16 133.8 TFLOPS: NVIDIA H100 Tensor Core GPU
  Architecture whitepaper, table 2 (H100 SXM5).
* **H200 SXM**: NVIDIA H200 Tensor Core GPU product brief: same compute figures as H100 SXM
  (FP64 34, FP64 tensor 67, FP32 67, TF32 tensor 494.5, BF16/FP16 tensor 989.5 TFLOPS dense);
  HBM3e 4.8 TB/s. Non-tensor FP16/BF16 as H100 SXM (same GH100 die).
* **Host link** (effective, one direction, pinned memory): PCIe 4.0 x16 is 31.5 GB/s raw, about
  25 GB/s achieved by ``cudaMemcpyAsync`` (RTX 3090, A100); PCIe 5.0 x16 is 63 GB/s raw, about
  50 GB/s achieved (H100, H200 in PCIe-attached hosts). Engineering figures, not datasheet ones.

Not datasheet figures (engineering estimates, same for all GPUs):

* ``launch_seconds`` 5 us: host-side cost of one eager ATen call on a GPU (Python, dispatcher,
  ``cudaLaunchKernel``); commonly measured at 4-10 us.
* ``view_seconds`` 2 us: a view op is host-only work (Python and dispatcher, no kernel).
* ``asynchronous``: a GPU runs kernels asynchronously to the Python thread that issues them,
  so the host-side cost of a call overlaps the device's work on the calls before it: the
  timeline (simulate/streams.py) issues each call on the host at its launch (or view) cost
  and runs it on the device once issued and once the device is free, for its device time
  alone. A step of large kernels is then bound by the device and a step of small ones by
  the issuing thread, as eager PyTorch is on a GPU. A CPU runs each call synchronously: its
  launch is part of the call's time.
* ``compute_half_flops`` = peak BF16 tensor rate x 2 us and ``memory_half_bytes`` = memory
  bandwidth x 2 us: the work at which a kernel reaches half its peak rate (wave quantization,
  tail effects, ramp-up). E.g. A100: a 1024^3 BF16 GEMM (2.1 GFLOP) gets 77% of peak, an 8 MB
  element-wise pass 66% of bandwidth -- in line with published microbenchmarks.
  ``compute_half_flops`` is stated at the device's top (tensor-core) rate; work priced at a
  lower rate reaches half of *that* rate at proportionally fewer FLOPs (DeviceProfile.
  compute_half), i.e. every kernel ramps up in the same time.

The ``cpu`` profile is deliberately rough: per-core figures of a current x86 server core
(AVX-512, ~3 GHz: 2 FMA units x 16 fp32 lanes, ~100 GFLOP/s achieved by MKL/oneDNN GEMM; about
12 GB/s of streaming bandwidth per core, more for cache-resident tiny tensors) scaled by the
thread count. On a CPU "host link" copies are ``memcpy`` within RAM.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

TERA = 1e12
GIGA = 1e9
MICRO = 1e-6

DIRECTIONS: tuple[str, ...] = ("d2h", "h2d")


def check_direction(direction: str) -> None:
    """Raise ValueError unless `direction` is "d2h" or "h2d"."""
    if direction not in DIRECTIONS:
        raise ValueError(f"copy direction {direction!r}: expected one of {DIRECTIONS}")


@dataclass(frozen=True)
class DeviceProfile:
    """Peak rates of one device and the shape of its utilization curve.

    matmul_flops: dense tensor-core peak FLOP/s per dtype name ("float16", "bfloat16", "tf32",
    "float64") for matmuls and convolutions. fp32 matmuls use the "tf32" rate when the model is
    built with tf32=True, else a "float32" entry if the device has one (CPUs: the GEMM rate),
    else vector_flops["float32"] (GPUs: FP32 without tensor cores). vector_flops: non-tensor
    peak FLOP/s per dtype name.
    Bandwidths in bytes/s; times in seconds. An op with work w achieves peak * w / (w + w_half),
    with w_half = compute_half(peak) for FLOPs and memory_half_bytes for bytes.
    """

    name: str
    matmul_flops: Mapping[str, float]
    vector_flops: Mapping[str, float]
    memory_bandwidth: float
    d2h_bandwidth: float
    h2d_bandwidth: float
    launch_seconds: float
    view_seconds: float
    compute_half_flops: float
    memory_half_bytes: float
    overlap_copies: bool
    asynchronous: bool = False      # calls issued on the host, run on the device (module doc)

    def vector_rate(self, dtype: str) -> float:
        """Non-tensor FLOP/s for element-wise and reduction work in `dtype`."""
        return self.vector_flops.get(_real_dtype(dtype), self.vector_flops["float32"])

    def matmul_rate(self, dtype: str, tf32: bool) -> float:
        """FLOP/s of a matmul or convolution in `dtype` (tensor cores where they apply)."""
        real = _real_dtype(dtype)
        if real == "float32":
            if tf32 and "tf32" in self.matmul_flops:
                return self.matmul_flops["tf32"]
            return self.matmul_flops.get("float32", self.vector_flops["float32"])
        return self.matmul_flops.get(real, self.vector_rate(real))

    def compute_half(self, rate: float) -> float:
        """FLOPs at which work priced at `rate` reaches half of it (see the module docstring)."""
        top = max(*self.matmul_flops.values(), *self.vector_flops.values())
        return self.compute_half_flops * rate / top

    def host_bandwidth(self, direction: str) -> float:
        """Effective host-link bytes/s for "d2h" (swap-out) or "h2d" (swap-in)."""
        check_direction(direction)
        return self.d2h_bandwidth if direction == "d2h" else self.h2d_bandwidth


def _real_dtype(dtype: str) -> str:
    """The floating dtype whose rate applies: complex -> its real part, integers -> float32."""
    if dtype == "complex128":
        return "float64"
    if dtype in ("float64", "float16", "bfloat16"):
        return dtype
    return "float32"


def _rates(**figures: float) -> Mapping[str, float]:
    """An immutable dtype -> FLOP/s table from TFLOPS figures."""
    return MappingProxyType({k: v * TERA for k, v in figures.items()})


def _gpu(name: str, *, matmul: Mapping[str, float], vector: Mapping[str, float],
         memory_gbs: float, host_gbs: float) -> DeviceProfile:
    """A GPU profile with the shared overhead and ramp estimates (see the module docstring)."""
    return DeviceProfile(
        name=name,
        matmul_flops=matmul,
        vector_flops=vector,
        memory_bandwidth=memory_gbs * GIGA,
        d2h_bandwidth=host_gbs * GIGA,
        h2d_bandwidth=host_gbs * GIGA,
        launch_seconds=5 * MICRO,
        view_seconds=2 * MICRO,
        compute_half_flops=matmul["bfloat16"] * 2 * MICRO,
        memory_half_bytes=memory_gbs * GIGA * 2 * MICRO,
        overlap_copies=True,
        asynchronous=True,
    )


PCIE4_X16_GBS = 25.0  # PCIe 4.0 x16, 31.5 GB/s raw per direction, ~25 GB/s effective
PCIE5_X16_GBS = 50.0  # PCIe 5.0 x16, 63 GB/s raw per direction, ~50 GB/s effective

RTX3090 = _gpu(
    "rtx3090",
    # GA102 whitepaper: tensor FP16/BF16 with FP32 accumulate 71, TF32 35.6 (dense)
    matmul=_rates(float16=71.0, bfloat16=71.0, tf32=35.6, float64=0.556),
    # GA102 whitepaper: FP32 35.6; FP16/BF16 non-tensor 35.6; FP64 1/64 of FP32
    vector=_rates(float32=35.6, float16=35.6, bfloat16=35.6, float64=0.556),
    memory_gbs=936.0,  # GA102 whitepaper: 19.5 Gbps GDDR6X, 384-bit
    host_gbs=PCIE4_X16_GBS,
)

A100_80GB = _gpu(
    "a100-80gb",
    # A100 datasheet (SXM): FP16/BF16 tensor 312, TF32 tensor 156, FP64 tensor 19.5 (dense)
    matmul=_rates(float16=312.0, bfloat16=312.0, tf32=156.0, float64=19.5),
    # A100 datasheet: FP32 19.5, FP64 9.7; A100 whitepaper: FP16 78, BF16 39 (non-tensor)
    vector=_rates(float32=19.5, float16=78.0, bfloat16=39.0, float64=9.7),
    memory_gbs=2039.0,  # A100 80GB SXM datasheet: HBM2e 2,039 GB/s
    host_gbs=PCIE4_X16_GBS,
)

H100 = _gpu(
    "h100",
    # H100 SXM datasheet: BF16/FP16 tensor 1,979 and TF32 989 are sparse; dense is half
    matmul=_rates(float16=989.5, bfloat16=989.5, tf32=494.5, float64=67.0),
    # H100 SXM datasheet: FP32 67, FP64 34; H100 whitepaper: FP16/BF16 non-tensor 133.8
    vector=_rates(float32=67.0, float16=133.8, bfloat16=133.8, float64=34.0),
    memory_gbs=3350.0,  # H100 SXM datasheet: HBM3 3.35 TB/s
    host_gbs=PCIE5_X16_GBS,
)

H200 = _gpu(
    "h200",
    # H200 product brief (SXM): same tensor figures as H100 SXM, dense = sparse / 2
    matmul=_rates(float16=989.5, bfloat16=989.5, tf32=494.5, float64=67.0),
    # H200 product brief: FP32 67, FP64 34; non-tensor FP16/BF16 as H100 SXM (same die)
    vector=_rates(float32=67.0, float16=133.8, bfloat16=133.8, float64=34.0),
    memory_gbs=4800.0,  # H200 product brief: HBM3e 4.8 TB/s
    host_gbs=PCIE5_X16_GBS,
)

GPU_PROFILES: Mapping[str, DeviceProfile] = MappingProxyType(
    {p.name: p for p in (RTX3090, A100_80GB, H100, H200)}
)
PROFILE_NAMES: tuple[str, ...] = (*GPU_PROFILES, "cpu")

# Rough per-core CPU figures (see the module docstring); scaled by the thread count.
CPU_MATMUL_GFLOPS_PER_CORE = 100.0   # MKL/oneDNN fp32 GEMM, AVX-512 core at ~3 GHz
CPU_VECTOR_GFLOPS_PER_CORE = 25.0    # element-wise kernels: ~1 FLOP per element, not FMA-bound
CPU_BANDWIDTH_GBS_PER_CORE = 12.0    # streaming bandwidth one core sustains
CPU_LAUNCH_SECONDS = 3 * MICRO       # eager ATen call from Python: dispatcher + TensorIterator
CPU_VIEW_SECONDS = 1.5 * MICRO       # a view: Python + dispatcher + TensorImpl, no kernel
CPU_COMPUTE_HALF_SECONDS = 1 * MICRO  # OpenMP fork/join and blocking overheads
CPU_MEMORY_HALF_SECONDS = 1 * MICRO   # likewise for memory-bound kernels


def cpu_profile(threads: int) -> DeviceProfile:
    """The rough CPU profile for `threads` intra-op threads (torch.get_num_threads())."""
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    gemm = CPU_MATMUL_GFLOPS_PER_CORE * threads / 1e3  # TFLOPS
    vector = CPU_VECTOR_GFLOPS_PER_CORE * threads / 1e3  # TFLOPS
    bandwidth = CPU_BANDWIDTH_GBS_PER_CORE * threads * GIGA
    return DeviceProfile(
        name="cpu",
        matmul_flops=_rates(float32=gemm, float16=gemm / 4, bfloat16=gemm, float64=gemm / 2),
        vector_flops=_rates(float32=vector, float16=vector / 2, bfloat16=vector / 2,
                            float64=vector / 2),
        memory_bandwidth=bandwidth,
        d2h_bandwidth=bandwidth / 2,  # a copy reads and writes every byte
        h2d_bandwidth=bandwidth / 2,
        launch_seconds=CPU_LAUNCH_SECONDS,
        view_seconds=CPU_VIEW_SECONDS,
        compute_half_flops=gemm * TERA * CPU_COMPUTE_HALF_SECONDS,
        memory_half_bytes=bandwidth * CPU_MEMORY_HALF_SECONDS,
        overlap_copies=False,
    )


HOST_THREADS = 16
"""Host cores that price work on the host beside a GPU profile (an update on the host, the
floors): the GPU machines this project measures on have 16."""


def host_profile(device: DeviceProfile) -> DeviceProfile:
    """The profile that prices nodes on the host beside `device`: the device itself when it is
    the CPU, else the rough CPU profile for HOST_THREADS cores."""
    return device if device.name == "cpu" else cpu_profile(HOST_THREADS)


def get_profile(name: str, *, cpu_threads: int = 1) -> DeviceProfile:
    """The profile called `name`; "cpu" is built for `cpu_threads` threads."""
    if name == "cpu":
        return cpu_profile(cpu_threads)
    try:
        return GPU_PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown device profile {name!r}; known: {', '.join(PROFILE_NAMES)}") \
            from None


def profile_for_gpu_name(device_name: str) -> DeviceProfile:
    """The closest GPU profile for a CUDA device name (H100 when nothing matches)."""
    text = device_name.lower()
    for marker, profile in (("3090", RTX3090), ("a100", A100_80GB), ("h200", H200),
                            ("h100", H100)):
        if marker in text:
            return profile
    return H100
