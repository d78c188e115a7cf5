"""iree-compile a lowered graph (cached by artifact key) and run it with iree.runtime."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from driftscope.core.atomic import write_json_atomic, write_text_atomic
from driftscope.core.digests import content_sha256
from driftscope.core.paths import cache_root
from driftscope.core.seal import holds, seal
from driftscope.errors import CompileError, RegistryError, RuntimeUnavailableError
from driftscope.model.weightfile import aligned_empty, is_aligned
from driftscope.taps.jax.graph import LoweredGraph, policy_digest

#: target -> (iree-compile flags, iree.runtime driver)
TARGETS: dict[str, tuple[tuple[str, ...], str]] = {
    "llvm-cpu": (
        (
            "--iree-hal-target-device=local",
            "--iree-hal-local-target-device-backends=llvm-cpu",
            "--iree-llvmcpu-target-cpu=host",
        ),
        "local-task",
    ),
    "cuda": (("--iree-hal-target-device=cuda",), "cuda"),
    "vulkan": (("--iree-hal-target-device=vulkan",), "vulkan"),
}
BASE_FLAGS = ("--iree-input-type=stablehlo",)
#: llvm-cpu graphs with at least this many bytes of arguments are compiled with ``--iree-opt-data-tiling``: the
#: 3B-shaped tower ran in 0.74x the time and the whole 3B forward (tower, prefill, decode) in 0.87x, outputs
#: identical; on the tiny fixtures it only slowed the compile (docs/benchmarks.md, "IREE's CPU compile flags")
DATA_TILING_FROM = 1 << 30


def size_flags(graph: LoweredGraph, target: str) -> tuple[str, ...]:
    """The flags a graph gets for its size (recorded in the artifact's identity with every other flag)."""
    if target == "llvm-cpu" and graph.argument_bytes >= DATA_TILING_FROM:
        return ("--iree-opt-data-tiling",)
    return ()


def default_cache_dir() -> Path:
    """The ``iree`` folder of driftscope's cache (``$DRIFTSCOPE_CACHE``, else the user cache folder)."""
    return cache_root() / "iree"


def target_flags(target: str) -> tuple[tuple[str, ...], str]:
    if target not in TARGETS:
        raise RegistryError(f"unknown IREE target {target!r}", f"use one of: {', '.join(sorted(TARGETS))}")
    return TARGETS[target]


def iree_compile_binary() -> Path:
    candidate = Path(sys.executable).parent / "iree-compile"
    found = candidate if candidate.exists() else shutil.which("iree-compile")
    if not found:
        raise RuntimeUnavailableError(
            "runtime 'iree' needs iree-compile (package 'iree-base-compiler')",
            "run `make setup`, or pip install iree-base-compiler",
        )
    return Path(found)


def host_cpu() -> str:
    """This machine's CPU as a host-tuned compile sees it: its model and a digest of its feature flags
    (``/proc/cpuinfo`` on Linux, else what ``platform`` says)."""
    import platform

    model, flags = platform.processor() or platform.machine(), ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "CPU part") and model in (platform.processor(), platform.machine()):
                model = value.strip()
            elif key in ("flags", "Features") and not flags:
                flags = value.strip()
    except OSError:
        pass
    digest = hashlib.sha256(" ".join(sorted(flags.split())).encode()).hexdigest()[:12] if flags else "unknown"
    return f"{platform.machine()} {model} (features {digest})"


def compiler_version() -> str:
    try:
        import importlib.metadata

        return importlib.metadata.version("iree-base-compiler")
    except Exception:  # noqa: BLE001 - any failure means "unknown", recorded as such
        return "unknown"


@dataclass
class Artifact:
    """A compiled module on disk and the key it was compiled under."""

    key: str
    path: Path  # module.vmfb
    stablehlo: Path
    identity: dict
    cache_hit: bool
    compile_s: float

    def to_dict(self) -> dict:
        return {
            "key": self.key,
            "vmfb": str(self.path),
            "stablehlo": str(self.stablehlo),
            "cache_hit": self.cache_hit,
            "compile_s": round(self.compile_s, 3),
            **self.identity,
        }


def artifact_identity(graph: LoweredGraph, target: str, extra_flags: tuple[str, ...] = ()) -> dict:
    flags, driver = target_flags(target)
    flags = BASE_FLAGS + flags + size_flags(graph, target) + tuple(extra_flags)
    cpu = [flag.split("=", 1)[1] for flag in flags if flag.startswith("--iree-llvmcpu-target-cpu=")]
    return {
        "stablehlo_digest": graph.digest,
        "compiler": f"iree-base-compiler {compiler_version()}",
        "target": target,
        "driver": driver,
        "flags": list(flags),
        # a host-tuned module runs only on a CPU like this one: a cache shared by other machines keeps them apart
        **({"host_cpu": host_cpu()} if cpu and cpu[-1] == "host" else {}),
        "policy": graph.policy.name,
        "policy_digest": policy_digest(graph.policy),
        "taps": list(graph.taps),
        "rows": graph.rows,
    }


def artifact_key(identity: dict) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]


def compile_graph(
    graph: LoweredGraph, target: str = "llvm-cpu", cache_dir: Path | None = None, extra_flags: tuple[str, ...] = ()
) -> Artifact:
    """The cached module for this graph/target/flags/policy/taps, compiling it only when absent. Processes that
    share the cache (batch workers, pytest-xdist workers) compile a key once: the others wait on its lock."""
    identity = artifact_identity(graph, target, tuple(extra_flags))
    key = artifact_key(identity)
    folder = (cache_dir or default_cache_dir()) / key
    vmfb, mlir, meta = folder / "module.vmfb", folder / "stablehlo.mlir", folder / "artifact.json"
    if _cached(vmfb, meta, key):
        return Artifact(key, vmfb, mlir, identity, True, 0.0)
    folder.mkdir(parents=True, exist_ok=True)
    with _key_lock(folder):
        if _cached(vmfb, meta, key):  # another process compiled it while this one waited
            return Artifact(key, vmfb, mlir, identity, True, 0.0)
        write_text_atomic(mlir, graph.text)
        partial = folder / f"module.vmfb.{os.getpid()}.partial"
        command = [str(iree_compile_binary()), str(mlir), *identity["flags"], "-o", str(partial)]
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        elapsed = time.perf_counter() - start
        if done.returncode != 0:
            partial.unlink(missing_ok=True)
            diagnostic = (done.stderr or done.stdout).strip()
            raise CompileError(
                f"iree-compile failed on {mlir} (exit {done.returncode}):\n{diagnostic[-4000:]}",
                f"the StableHLO is kept at {mlir}; rerun `{' '.join(command)}` to reproduce",
            )
        os.replace(partial, vmfb)
        module = {"key": key, "sha256": content_sha256(vmfb)}
        write_json_atomic(meta, {"key": key, **identity, "compile_s": elapsed, "module": module, "seal": seal(module)})
    return Artifact(key, vmfb, mlir, identity, False, elapsed)


def _cached(vmfb: Path, meta: Path, key: str) -> bool:
    """Whether the folder holds this key's module: its record names the key, and its sealed SHA-256 (``core.seal``:
    a key kept outside the cache) is the module's (a module copied in from another key, or rewritten, is not)."""
    try:
        record = json.loads(meta.read_text())
        module = record.get("module") or {}
        return (
            record.get("key") == key
            and module.get("key") == key
            and holds(module, record.get("seal"))
            and content_sha256(vmfb) == module.get("sha256")
        )
    except (OSError, ValueError, AttributeError):
        return False


@contextmanager
def _key_lock(folder: Path) -> Iterator[None]:
    """An exclusive lock on ``folder/.lock`` (released when the process dies); no lock where fcntl is absent."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: concurrent compiles still write separate partial files
        yield
        return
    with open(folder / ".lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


_CONFIGS: dict[str, object] = {}


def iree_config(driver: str):
    """One runtime Config (instance and device) per driver, shared by every module and device buffer."""
    import iree.runtime as ireert

    if driver not in _CONFIGS:
        _CONFIGS[driver] = ireert.Config(driver)
    return _CONFIGS[driver]


#: Drivers whose device memory is host memory: numpy arrays are imported there without a copy.
HOST_DRIVERS = ("local-task", "local-sync")


def device_array(driver: str, array: np.ndarray):
    """``array`` on the device: imported without a copy on host-memory drivers (the buffer keeps it alive),
    copied elsewhere. Misaligned or strided arrays are copied once into an aligned host array first."""
    import iree.runtime as ireert
    from iree.runtime.array_interop import map_dtype_to_element_type

    config = iree_config(driver)
    if driver not in HOST_DRIVERS:
        return ireert.asdevicearray(config.device, np.ascontiguousarray(array))
    if not is_aligned(array):
        copy = aligned_empty(array.shape, array.dtype)
        copy[...] = array
        array = copy
    buffer = config.device.allocator.import_host_allocation(
        array, ireert.MemoryType.DEVICE_LOCAL | ireert.MemoryType.HOST_VISIBLE, ireert.BufferUsage.DEFAULT
    )
    view = ireert.HalBufferView(buffer, array.shape, map_dtype_to_element_type(array.dtype))
    result = ireert.DeviceArray(config.device, view)
    # the imported memory must outlive every view of it; the bindings only tie it to the HalBuffer object
    result.host_memory = array
    return result


class DeviceWeights:
    """Weights put on the device once and passed to every call by reference (no per-call copy; on the
    CPU drivers no copy at all: the device reads the host arrays in place)."""

    def __init__(self, driver: str):
        self.driver = driver
        self._arrays: dict[int, object] = {}

    def __call__(self, array: np.ndarray):
        key = id(array)
        if key not in self._arrays:
            self._arrays[key] = (array, device_array(self.driver, array))
        return self._arrays[key][1]


class IreeModule:
    """A loaded ``module.vmfb``: call it with the flat argument list, get ``{output name: array}``."""

    def __init__(self, artifact: Artifact, output_names: list[str]):
        import iree.runtime as ireert

        self.artifact = artifact
        self.output_names = output_names
        config = iree_config(artifact.identity["driver"])
        vm_module = ireert.VmModule.mmap(config.vm_instance, str(artifact.path))
        self._module = ireert.load_vm_module(vm_module, config)

    def __call__(self, arguments: list) -> dict[str, np.ndarray]:
        driver = self.artifact.identity["driver"]
        arguments = [device_array(driver, a) if isinstance(a, np.ndarray) else a for a in arguments]
        results = self._module.main(*arguments)
        if not isinstance(results, (tuple, list)):
            results = (results,)
        # an output may alias an argument (a function returning one of its inputs): it holds the arguments too
        return {name: _host(r, arguments) for name, r in zip(self.output_names, results, strict=True)}


class _Pinned:
    """Exposes a mapped host array while holding the device array whose mapping it is."""

    def __init__(self, array: np.ndarray, owner: object):
        self.__array_interface__ = array.__array_interface__
        self._array, self._owner = array, owner


def _host(result, arguments: list) -> np.ndarray:
    """An output as a numpy array without a copy: on the CPU drivers ``to_host`` maps the device buffer, which
    is unmapped (and its memory reused by the next call) once the device array is dropped, so the array holds
    the device array for as long as it, or any view of it, lives. An output that is an argument's buffer (an
    imported host array) also needs that argument's host memory: the array holds the arguments as well."""
    return np.asarray(_Pinned(np.asarray(result.to_host()), (result, arguments)))
