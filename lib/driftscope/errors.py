"""One exception hierarchy: every error a user can cause names the problem and the fix."""

from __future__ import annotations


class DriftscopeError(Exception):
    """Base class. ``str(err)`` is a complete message: what is wrong and what to do."""

    def __init__(self, problem: str, fix: str | None = None):
        self.problem = problem
        self.fix = fix
        super().__init__(problem if fix is None else f"{problem}\n  fix: {fix}")


class CheckpointError(DriftscopeError):
    """The checkpoint directory is missing, incomplete or not in safetensors."""


class InputError(DriftscopeError):
    """An input image is missing, unreadable or outside what the processor accepts."""


class ParameterError(DriftscopeError):
    """A parameter file has unknown keys, wrong types or bad values."""


class ContractError(DriftscopeError):
    """A tolerance contract cannot be read or is malformed."""


class RegistryError(DriftscopeError):
    """An unknown name was asked of a registry (runtime, family, policy)."""


class RuntimeUnavailableError(DriftscopeError):
    """A runtime's package is not installed."""


class PortLimitError(RuntimeUnavailableError):
    """An engine's port of the model cannot represent a setting the checkpoint's (correct) config.json makes."""


class TapFileError(DriftscopeError):
    """A TapSet on disk is missing, truncated or inconsistent with its sidecar."""


class HypothesisPatchError(DriftscopeError):
    """A hypothesis patch's dotted path cannot be imported or is not callable."""


class ReportError(DriftscopeError):
    """A report.json is missing, unreadable, of another schema, or of a run that did not complete."""


class CompileError(DriftscopeError):
    """A compiler (iree-compile) rejected a lowered graph; the message carries its own diagnostic."""


class OutputError(DriftscopeError):
    """An output file could not be written (a full disk, a read-only folder): ``path`` and ``errno`` say which
    and why; nothing is left under the file's final name."""

    def __init__(self, problem: str, fix: str | None = None, path: str | None = None, errno: int | None = None):
        super().__init__(problem, fix)
        self.path, self.errno = path, errno


def output_error(err: OSError, path) -> OutputError:
    """``err`` (raised writing ``path``) as the error a user reads: the file, the errno and what to do."""
    return OutputError(
        f"cannot write {path}: [Errno {err.errno}] {err.strerror or err}",
        "free space on that disk (or pass another --out) and run again",
        path=str(path),
        errno=err.errno,
    )


def did_you_mean(name: str, names: list[str], limit: int = 3) -> str:
    """``"did you mean 'vision.block.5.mlp.act'? "`` for the names closest to a mistyped ``name`` (difflib's ratio,
    dotted parts compared too), or "" when none is close."""
    import difflib

    close = difflib.get_close_matches(name, names, n=limit, cutoff=0.75)
    if not close:  # a mistyped part of a long dotted id (``mlp.acts``) weighs little against the whole
        parts = name.split(".")
        same = [n for n in names if len(n.split(".")) == len(parts)]
        scored = [
            (sum(difflib.SequenceMatcher(None, a, b).ratio() for a, b in zip(parts, n.split("."), strict=True)), n)
            for n in same
        ]
        close = [n for score, n in sorted(scored, reverse=True)[:limit] if score >= len(parts) - 0.5]
    return f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""


def some(names: list[str], limit: int = 5) -> str:
    """The first ``limit`` of ``names`` for an error message, and how many there are when that is not all."""
    return ", ".join(names[:limit]) + (f", ... ({len(names)} in all)" if len(names) > limit else "")
