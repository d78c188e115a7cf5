"""Git checkouts for batches: the repository of the parameter files, a commit's temporary worktree."""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from driftscope.errors import ParameterError


def git(args: list[str], cwd: Path) -> str:
    """``git args`` in ``cwd``; a failure is a :class:`ParameterError` carrying git's own message."""
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise ParameterError(
            f"git {' '.join(args)} failed in {cwd}: {done.stderr.strip()}",
            "pass a revision of the repository that holds the parameter files",
        )
    return done.stdout.strip()


def toplevel(path: Path) -> Path | None:
    """The root of the git repository holding ``path``, or None outside one."""
    done = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=path, capture_output=True, text=True)
    return Path(done.stdout.strip()) if done.returncode == 0 else None


def short_sha(revision: str, top: Path) -> str:
    """The 12-character commit id ``revision`` names in ``top`` (the outputs directory's name)."""
    return git(["rev-parse", "--short=12", f"{revision}^{{commit}}"], top)


def head_matches(tree: Path, label: str) -> bool:
    """Whether ``tree``'s HEAD is the commit of the label (``abc123`` or ``abc123-dirty``)."""
    sha = label.removesuffix("-dirty")
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True)
    return done.returncode == 0 and done.stdout.strip().startswith(sha)


@contextlib.contextmanager
def temporary_worktree(top: Path, sha: str) -> Iterator[Path]:
    """A detached worktree of ``sha`` of the repository ``top``, removed when the block ends (also on Ctrl-C)."""
    with tempfile.TemporaryDirectory(prefix=f"driftscope-{sha}-") as temp:
        tree = Path(temp) / "tree"
        try:
            git(["worktree", "add", "--detach", str(tree), sha], top)
            yield tree
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=top, capture_output=True)
            subprocess.run(["git", "worktree", "prune"], cwd=top, capture_output=True)


@contextlib.contextmanager
def checkout(sha: str | None, top: Path) -> Iterator[Path]:
    """``top`` itself as it is (``sha`` None), or a temporary worktree of commit ``sha``."""
    if sha is None:
        yield top
        return
    with temporary_worktree(top, sha) as tree:
        yield tree


def link_missing(tree: Path, fallback: Path, relative: Iterable[str]) -> list[str]:
    """Link each repository-relative path the commit's ``tree`` lacks (git-ignored fixtures) to ``fallback``'s."""
    linked = []
    if tree.resolve() == fallback.resolve():
        return linked
    for name in relative:
        target, source = tree / name, fallback / name
        if target.exists() or target.is_symlink() or not source.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(source.resolve(), target_is_directory=source.is_dir())
        linked.append(name)
    return linked
