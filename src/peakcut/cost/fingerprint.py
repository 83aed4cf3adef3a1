"""What measured latencies depend on: the device, the PyTorch build, the cache schema.

CPU: the CPU model (``model name`` of /proc/cpuinfo, else platform.processor()), the
intra-op thread count (torch.get_num_threads()) and the ISA PyTorch dispatches to.
CUDA: the device name and compute capability. Measurements from another fingerprint are
never reused.
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

CPUINFO = Path("/proc/cpuinfo")


@functools.cache
def cpu_model_name(cpuinfo: Path = CPUINFO) -> str:
    """The CPU's model name, or "unknown cpu" (read once per process)."""
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown cpu"


def device_description(device: torch.device) -> str:
    """One line naming the device as far as timing is concerned."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        major, minor = torch.cuda.get_device_capability(device)
        return f"cuda: {name} (sm_{major}{minor})"
    threads = torch.get_num_threads()
    isa = torch.backends.cpu.get_cpu_capability()
    return f"cpu: {cpu_model_name()} ({threads} threads, {isa})"


@dataclass(frozen=True)
class Fingerprint:
    """The identity a measured cost table belongs to."""

    device: str
    torch: str
    schema: int

    def as_dict(self) -> dict[str, str | int]:
        return asdict(self)

    def file_name(self) -> str:
        """'cpu-<16 hex digits>.json': a readable prefix and a hash of the whole fingerprint."""
        text = json.dumps(self.as_dict(), sort_keys=True)
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        prefix = re.sub(r"[^a-z0-9]+", "", self.device.partition(":")[0].lower()) or "device"
        return f"{prefix}-{digest}.json"


def device_fingerprint(device: torch.device, schema: int) -> Fingerprint:
    """The fingerprint of timing on `device` with this PyTorch."""
    return Fingerprint(device=device_description(device), torch=torch.__version__, schema=schema)
