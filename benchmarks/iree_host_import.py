"""Which alignments IREE's CPU driver can read imported host memory at (docs/benchmarks-history.md, "The drill-down
of a text-layer divergence, and the one-off baseline").

``capture/iree.py``'s ``device_array`` imports a host array without a copy (``import_host_allocation``) where it
sits on a 64-byte boundary and copies it first otherwise. This probe imports a 4x4 float32 weight from a
copy-on-write memory map of a file at each offset past a 64-byte boundary, runs a compiled matmul on it and checks
the result against numpy. Each offset runs in a process of its own, since a misaligned read kills the process.

    .venv/bin/python benchmarks/iree_host_import.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

SHIFTS = (0, 8, 16, 24, 32, 48, 56)
MATMUL = """
func.func @main(%x: tensor<4x4xf32>, %w: tensor<4x4xf32>) -> tensor<4x4xf32> {
  %z = arith.constant dense<0.0> : tensor<4x4xf32>
  %r = linalg.matmul ins(%x, %w : tensor<4x4xf32>, tensor<4x4xf32>) outs(%z : tensor<4x4xf32>) -> tensor<4x4xf32>
  return %r : tensor<4x4xf32>
}
"""


def one(shift: int, folder: Path) -> str:
    """Import the weight ``shift`` bytes past a 64-byte boundary of a mapped file and call the matmul on it."""
    import iree.compiler as compiler
    import iree.runtime as ireert
    from iree.runtime.array_interop import map_dtype_to_element_type

    config = ireert.Config("local-task")
    vmfb = compiler.compile_str(MATMUL, target_backends=["llvm-cpu"], input_type="auto")
    module = ireert.load_vm_module(ireert.VmModule.copy_buffer(config.vm_instance, vmfb), config)
    weight = np.arange(16, dtype=np.float32).reshape(4, 4)
    x = np.eye(4, dtype=np.float32) * 2
    path = folder / f"weight-{shift}.bin"
    path.write_bytes(bytes(4096 + shift) + weight.tobytes() + bytes(4096))
    mapped = np.memmap(path, dtype=np.uint8, mode="c")[4096 + shift : 4096 + shift + 64].view(np.float32)
    mapped = mapped.reshape(4, 4)
    assert mapped.ctypes.data % 64 == shift
    usage, memory = ireert.BufferUsage.DEFAULT, ireert.MemoryType.DEVICE_LOCAL | ireert.MemoryType.HOST_VISIBLE
    buffer = config.device.allocator.import_host_allocation(mapped, memory, usage)
    view = ireert.HalBufferView(buffer, mapped.shape, map_dtype_to_element_type(mapped.dtype))
    out = module.main(x, ireert.DeviceArray(config.device, view)).to_host()
    return "matches numpy" if np.array_equal(out, x @ weight) else "differs from numpy"


def main() -> None:
    if len(sys.argv) == 3:  # a child: one offset
        print(one(int(sys.argv[1]), Path(sys.argv[2])))
        return
    print("| bytes past a 64-byte boundary | the call |\n|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for shift in SHIFTS:
            done = subprocess.run(
                [sys.executable, __file__, str(shift), folder], capture_output=True, text=True, check=False
            )
            said = done.stdout.strip().splitlines()[-1] if done.returncode == 0 else f"process died ({done.returncode})"
            print(f"| {shift} | {said} |", flush=True)


if __name__ == "__main__":
    main()
