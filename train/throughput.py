"""Tokens/s and model FLOPs utilisation (MFU) for tasks that count tokens, with the table of GPU peaks.

MFU = achieved model FLOPs/s (FLOPs per token x tokens/s) over the hardware's peak (Chowdhery et al.
2022, "PaLM", section 4.1 and Appendix B). The peaks are NVIDIA's published dense figures: the
datasheets list bf16 "with sparsity" (2:4 structured), twice the dense rate a transformer's matmuls
can reach, so the dense figure is half of it.
"""

from __future__ import annotations

from dataclasses import dataclass

# (substrings of torch.cuda.get_device_name(), all required; dense bf16 TFLOPS; source). The first
# match wins, so the more specific names come first.
PEAK_BF16_TFLOPS: tuple[tuple[tuple[str, ...], float, str], ...] = (
    (("H100", "NVL"), 835.0, "https://www.nvidia.com/en-us/data-center/h100/ (H100 NVL: 1,671 sparse)"),
    (("H100", "PCIe"), 756.0, "https://www.nvidia.com/en-us/data-center/h100/ (H100 PCIe: 1,513 sparse)"),
    (("H100",), 989.4, "https://www.nvidia.com/en-us/data-center/h100/ (H100 SXM: 1,979 with sparsity)"),
    (("H200",), 989.4, "https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM: 1,979 with sparsity)"),
    (("A100",), 312.0, "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
                       "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf (BF16 312 | 624 with sparsity)"),
    (("L40S",), 362.05, "https://www.nvidia.com/en-us/data-center/l40s/ (BF16 733 with sparsity)"),
    (("L4",), 121.0, "https://www.nvidia.com/en-us/data-center/l4/ (BF16 242 with sparsity)"),
    (("A10",), 125.0, "https://www.nvidia.com/en-us/data-center/products/a10-gpu/ (BF16 125 | 250 with "
                      "sparsity); AWS's A10G is not in NVIDIA's tables and is left out"),
)


def peak_flops(device_name: str) -> float | None:
    """The GPU's dense bf16 peak in FLOP/s, None for one the table does not know (no MFU then)."""
    if "A10G" in device_name:
        return None
    for needles, tflops, _ in PEAK_BF16_TFLOPS:
        if all(n in device_name for n in needles):
            return tflops * 1e12
    return None


def mfu(flops_per_token: float, tokens_per_s_per_gpu: float, peak: float) -> float:
    return flops_per_token * tokens_per_s_per_gpu / peak


@dataclass(frozen=True)
class TokenRate:
    """What turns samples/s into tokens/s and MFU: the task's tokens per sample and FLOPs per token, and
    the GPU's peak (None on CPUs and unknown GPUs: no MFU). Empty for a task that counts no tokens."""

    tokens_per_sample: int | None = None
    flops_per_token: float | None = None
    peak: float | None = None

    @classmethod
    def of(cls, task, model, device) -> TokenRate:
        tokens = task.tokens_per_sample()
        if tokens is None:
            return cls()
        name = None
        if device.type == "cuda":
            import torch

            name = torch.cuda.get_device_name(device)
        return cls(tokens, task.flops_per_token(model), peak_flops(name) if name else None)

    def record(self, samples_per_sec: float, world_size: int) -> dict[str, float]:
        """{"tokens_per_sec": all workers', "mfu": per GPU against its peak} (what applies)."""
        if self.tokens_per_sample is None:
            return {}
        out = {"tokens_per_sec": samples_per_sec * self.tokens_per_sample}
        if self.flops_per_token and self.peak:
            out["mfu"] = mfu(self.flops_per_token, out["tokens_per_sec"] / world_size, self.peak)
        return out
