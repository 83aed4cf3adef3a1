"""bench.distributed: the simulated FSDP2 table runs end to end on a tiny Llama over 4 fake ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers")

from bench.distributed import PEERS, Row, main  # noqa: E402
from peakcut.cost.links import INFINIBAND_NDR, NVLINK4  # noqa: E402


def test_tiny_table_has_every_column(tmp_path: Path) -> None:
    import torch.distributed as dist

    out = tmp_path / "table.md"
    results = main(["--rows", "tiny:h100x4", "--limits", "24GB", "--budget", "0.5", "--out", str(out)])
    assert not dist.is_initialized()                  # the fake process group is gone
    (r,) = results
    assert r["errors"] == {}, r["errors"]             # every FSDP2 peer was built on the graph
    cells = r["cells"]
    assert set(cells) == {*PEERS, "peakcut latency", "peakcut 24GB"}
    assert cells["fsdp2"]["peak_bytes"] <= cells["captured"]["peak_bytes"]
    assert cells["fsdp2_ac"]["peak_bytes"] < cells["fsdp2"]["peak_bytes"]
    assert cells["peakcut 24GB"]["met"]
    text = out.read_text()
    assert "| Llama-2-tiny | 4 x H100 (nvlink4) |" in text and "simulated" in text


def test_rows_name_their_link() -> None:
    assert Row.parse("7b:h100x8").link == NVLINK4
    assert Row.parse("13b:h200x16").link == INFINIBAND_NDR
    for bad in ("7b-h100x8", "7b:a100x8", "7b:h100x1", "8b:h100x8"):
        with pytest.raises(ValueError, match="--rows"):
            Row.parse(bad)
