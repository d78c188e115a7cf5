"""A transformers model whose weights stream from the memory-mapped checkpoint, module by module: the float32 (or
float64) reference of a checkpoint larger than the machine's memory (``options: {stream: true}`` of the
``transformers`` runtime).

The model is built from its config with every parameter on torch's ``meta`` device (buffers, e.g. the rotary
frequencies, made on the CPU as ``from_pretrained`` makes them). Each module that owns parameters gets them just
before it runs (a forward pre-hook: each parameter read from the memory-mapped safetensors under the family's
declared load layout, ``model.load_layout``, widened to the policy's dtype; a float32 tensor in a float32 run is
used in place, no copy) and gives them back right after (a forward hook: the parameter is ``meta`` again and the
file's pages are dropped from this process, ``MADV_DONTNEED``). So only the module running holds weights: the
prefill and each decode step read the whole model once (a *pass*), and resident memory is the activations, the KV
cache and one module's weights. The family's own taps, decode and replay run unchanged on it.

What streaming cost is recorded (:meth:`Streamer.record`): the passes, the bytes read from the mapping (each
tensor's stored bytes, every time it is read) and the bytes the process read from the disk
(``/proc/self/io``: what the page cache did not hold).
"""

from __future__ import annotations

import contextlib
import mmap
from pathlib import Path
from typing import Any

import numpy as np

from driftscope.errors import CheckpointError
from driftscope.model.weightfile import DTYPES, PAGE, TensorEntry, read_header


@contextlib.contextmanager
def meta_parameters():
    """Every parameter a module registers while active is made on torch's ``meta`` device (no memory); buffers
    stay real. A parameter already on ``meta`` is kept as it is (so tied parameters stay one object)."""
    import torch

    original = torch.nn.Module.register_parameter

    def register(module, name, param):
        if param is not None and param.device.type != "meta":
            param = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        original(module, name, param)

    torch.nn.Module.register_parameter = register
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = original


class MappedCheckpoint:
    """Every tensor of a checkpoint directory's safetensors files, memory-mapped (copy on write: an array handed
    out may be written without touching the file); ``read`` and ``read_rows`` as ``weightfile.TensorFiles`` gives
    them (the load audit's reader), in ``dtype``."""

    def __init__(self, path: str | Path, dtype=np.float32):
        self.path, self.dtype = Path(path), np.dtype(dtype)
        files = sorted(self.path.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"checkpoint {self.path} has no *.safetensors files", "point at a saved checkpoint")
        self.entries: dict[str, TensorEntry] = {}
        self._maps: dict[Path, mmap.mmap] = {}
        for file in files:
            self.entries.update(read_header(file))
            with open(file, "rb") as handle:
                self._maps[file] = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
        self.bytes_read = 0

    def names(self) -> list[str]:
        return list(self.entries)

    def _stored(self, name: str) -> tuple[TensorEntry, np.ndarray]:
        entry = self.entries[name]
        if entry.dtype not in DTYPES:
            raise CheckpointError(
                f"checkpoint tensor {name!r} is stored as {entry.dtype}", f"store it as one of {', '.join(DTYPES)}"
            )
        stored = DTYPES[entry.dtype][0]
        count = entry.nbytes // np.dtype(stored).itemsize
        raw = np.frombuffer(self._maps[entry.file], dtype=stored, count=count, offset=entry.start)
        return entry, raw.reshape(entry.shape)

    def _widened(self, entry: TensorEntry, raw: np.ndarray) -> np.ndarray:
        if raw.dtype == self.dtype:
            return raw  # in place: the mapping's pages
        return np.asarray(DTYPES[entry.dtype][1](raw), dtype=self.dtype)

    def read(self, name: str) -> np.ndarray:
        """The whole tensor in ``dtype`` (a view of the mapping where it is stored so)."""
        entry, raw = self._stored(name)
        self.bytes_read += entry.nbytes
        return self._widened(entry, raw)

    def read_rows(self, name: str, rows) -> np.ndarray:
        entry, raw = self._stored(name)
        picked = raw[np.asarray(list(rows), dtype=np.int64)]
        self.bytes_read += picked.nbytes
        return np.array(self._widened(entry, picked), dtype=self.dtype)

    def drop(self, name: str) -> None:
        """Drop the tensor's pages from this process (the page cache keeps them; a later read faults them in)."""
        entry = self.entries[name]
        start = entry.start - entry.start % PAGE
        length = entry.start + entry.nbytes - start
        with contextlib.suppress(OSError, ValueError):
            self._maps[entry.file].madvise(mmap.MADV_DONTNEED, start, length)

    def close(self) -> None:
        for mapping in self._maps.values():
            with contextlib.suppress(BufferError):  # an array still viewing it keeps the mapping alive
                mapping.close()
        self._maps.clear()


@contextlib.contextmanager
def streaming(runtime: Any):
    """Around a streamed model's forward: a weight read outside its module's call (a tap reading a parameter
    directly) finds it on ``meta``; that is said as what it is, not as torch's meta-tensor error."""
    try:
        yield
    except (NotImplementedError, RuntimeError) as err:
        if "meta" not in str(err):
            raise
        from driftscope.errors import RuntimeUnavailableError

        raise RuntimeUnavailableError(
            f"the {runtime.family.name} family reads a weight outside its module's call ({err}): its transformers "
            "reference cannot stream its weights",
            "load it whole (drop options.stream)",
        ) from err


def disk_read_bytes() -> int:
    """Bytes this process has caused to be read from storage (``/proc/self/io``; 0 where there is none)."""
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def units(model: Any) -> list[tuple[str, Any, bool]]:
    """The modules whose weights come and go together, in the model's order, as ``(name, module, whole)``: each
    block of a list of blocks (a decoder layer, a vision block: ``whole``, every parameter under it) and, outside
    those, each module owning parameters itself (an embedding, a norm, a head: its own parameters only)."""
    import torch

    found, blocks = [], []
    lists = {id(m) for m in model.modules() if isinstance(m, torch.nn.ModuleList)}
    parents = {id(child): id(parent) for parent in model.modules() for child in parent.children()}
    for prefix, module in model.named_modules():
        if any(prefix.startswith(f"{block}.") for block in blocks):
            continue
        if parents.get(id(module)) in lists and any(True for _ in module.parameters()):
            found.append((prefix, module, True))
            blocks.append(prefix)
        elif any(p is not None for p in module._parameters.values()):
            found.append((prefix, module, False))
    return found


class Streamer:
    """The hooks that give each unit (:func:`units`) its parameters while it runs (see the module's docstring)."""

    def __init__(self, model: Any, files: MappedCheckpoint, sources: dict[str, tuple], torch_dtype: Any):
        import torch

        self.model, self.files, self.dtype = model, files, torch_dtype
        self.sources = sources  # parameter name -> (checkpoint tensors, Held)
        #: unit id -> [(owning module, its name for the parameter, the full name, shape, dtype)]
        self.owners: dict[int, list[tuple[Any, str, str, tuple, Any]]] = {}
        self.depth: dict[int, int] = {}  # unit id -> calls in progress (a unit may run inside itself)
        self.handles: list[Any] = []
        self.resident = 0  # bytes of parameters held now
        self.peak_resident = 0
        self.units_run = 0
        self.runs: dict[int, int] = {}  # unit id -> times it ran
        self._disk_start = disk_read_bytes()
        self._torch = torch
        for prefix, unit, whole in units(model):
            held = []
            for inner, module in unit.named_modules() if whole else [("", unit)]:
                for own, param in module._parameters.items():
                    if param is not None:
                        full = ".".join(part for part in (prefix, inner, own) if part)
                        held.append((module, own, full, tuple(param.shape), param.dtype))
            self.owners[id(unit)] = held
            self.handles.append(unit.register_forward_pre_hook(self._give))
            self.handles.append(unit.register_forward_hook(self._take, always_call=True))

    def value(self, name: str):
        """The parameter ``name`` as the checkpoint makes it (the declared layout's sources and operations)."""
        from driftscope.capture.load_audit import held_value

        sources, held = self.sources[name]
        return self._torch.from_numpy(np.ascontiguousarray(held_value(self.files, sources, held, None)))

    def _give(self, unit, args) -> None:
        key = id(unit)
        self.depth[key] = self.depth.get(key, 0) + 1
        self.runs[key] = self.runs.get(key, 0) + 1
        self.units_run += 1
        if self.depth[key] > 1:
            return
        for module, own, full, _, _ in self.owners[key]:
            tensor = self.value(full).to(self.dtype)
            module._parameters[own] = self._torch.nn.Parameter(tensor, requires_grad=False)
            self.resident += tensor.numel() * tensor.element_size()
        self.peak_resident = max(self.peak_resident, self.resident)

    def _take(self, unit, args, output) -> None:
        key = id(unit)
        self.depth[key] = self.depth.get(key, 1) - 1
        if self.depth[key] > 0:
            return
        torch = self._torch
        for module, own, full, shape, dtype in self.owners[key]:
            param = module._parameters.get(own)
            if param is None or param.device.type == "meta":
                continue
            self.resident -= param.numel() * param.element_size()
            module._parameters[own] = torch.nn.Parameter(torch.empty(shape, dtype=dtype, device="meta"), False)
            for source in self.sources[full][0]:
                self.files.drop(source)

    def record(self) -> dict:
        """What streaming cost so far: the passes (the prefill and each decode step, one each: the runs of the output
        head), the modules run, bytes read from the mapping and from the disk."""
        head = self.model.get_output_embeddings() if hasattr(self.model, "get_output_embeddings") else None
        return {
            "passes": self.runs.get(id(head), 0) if head is not None else max(self.runs.values(), default=0),
            "units_run": self.units_run,
            "mapped_bytes_read": int(self.files.bytes_read),
            "disk_bytes_read": int(disk_read_bytes() - self._disk_start),
            "peak_resident_weight_bytes": int(self.peak_resident),
        }

    def loaded_tensors(self) -> dict:
        """The load audit's view: every parameter's shape and dtype, and its rows as the hooks read them."""
        from driftscope.capture.load_audit import held_value

        out = {}
        for name, param in self.model.named_parameters():
            sources, held = self.sources[name]

            def rows_of(rows, sources=sources, held=held):
                return np.asarray(held_value(self.files, sources, held, rows), dtype=np.float64)

            out[name] = (tuple(param.shape), str(param.dtype).removeprefix("torch."), rows_of)
        return out

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        self.files.close()


def streamed_model(runtime: Any, transformers: Any, dtype: Any) -> tuple[Any, Streamer]:
    """``runtime``'s model class built from the checkpoint's config on ``meta``, and the :class:`Streamer` that gives
    its modules their weights; a checkpoint error names any parameter no checkpoint tensor makes."""
    import torch

    from driftscope.capture.load_audit import declared

    layout = runtime.family.load_layout(runtime.name, runtime.checkpoint)
    if layout is None:
        raise CheckpointError(
            f"the {runtime.family.name} family declares no load layout for transformers: its weights cannot be "
            "streamed (each parameter's checkpoint tensor is unknown)",
            "load it whole (drop options.stream)",
        )
    path = runtime.checkpoint.path
    config = transformers.AutoConfig.from_pretrained(str(path))
    kwargs = dict(runtime.capabilities.load_kwargs)
    with meta_parameters():
        cls = getattr(transformers, runtime.taps.MODEL_CLASS)
        model = (cls.from_config if cls.__name__.startswith("AutoModel") else cls._from_config)(
            config, dtype=dtype, attn_implementation=runtime.options.get("attn_implementation", "eager"), **kwargs
        )
    files = MappedCheckpoint(path, np.float64 if dtype == torch.float64 else np.float32)
    wanted = declared(layout, files.names())
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    sources, unmade = {}, []
    for names in groups.values():  # tied parameters (one object) share the tensor any of their names is made from
        made = next((wanted[name] for name in names if name in wanted), None)
        if made is None:
            unmade += names
        sources.update({name: made for name in names})
    if unmade:
        shown = ", ".join(unmade[:5]) + (f" and {len(unmade) - 5} more" if len(unmade) > 5 else "")
        raise CheckpointError(
            f"no tensor of checkpoint {path} makes {len(unmade)} parameter(s) of the streamed model: {shown}",
            "check the family's declared load layout, or load the model whole (drop options.stream)",
        )
    return model, Streamer(model, files, sources, dtype)
