"""How a runtime holds a checkpoint's tensors, declared by the checkpoint's family as data (``Family.load_layout``),
so that a load can be audited against the checkpoint (``capture.load_audit``) without trusting the loader.

Every checkpoint tensor is renamed by ``names`` (exact names, where a loader's own renaming was read name by name),
then by ``renames`` (regular expressions, in order) into the name a runtime holds it under, and its value is the
checkpoint's unless a rule says otherwise: ``transpose`` (axes), ``half`` (one half of an axis: a fused tensor the
runtime holds split), ``reshape`` (the same values in another shape), ``rows`` (a range of rows of the tensors
``sources`` stacked: a vocabulary held in two parts), then cast to the dtype the runtime holds. A tensor a runtime
does not hold and a parameter it does not read from the checkpoint (a tied head) are named too; anything else
unmatched is a finding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

#: an operation on a checkpoint tensor: ("transpose", axes) | ("half", axis, which) | ("rows", start, stop) |
#: ("reshape", shape)
Op = tuple


@dataclass(frozen=True)
class Held:
    """One loaded parameter made from the checkpoint tensor a rule matched: its name (the rule's ``re.sub``
    replacement of the renamed name; the name itself by default) and the operations that make its value."""

    name: str = r"\g<0>"
    ops: tuple[Op, ...] = ()
    #: the checkpoint tensors (their names in the checkpoint) stacked along the first axis before ``ops`` (default:
    #: the matched one)
    sources: tuple[str, ...] = ()


@dataclass(frozen=True)
class TensorRule:
    """Checkpoint tensors whose renamed name fully matches ``pattern`` are held as ``held`` (one or several)."""

    pattern: str
    held: tuple[Held, ...] = (Held(),)


@dataclass(frozen=True)
class LoadLayout:
    """How one runtime holds one checkpoint's tensors (see the module's docstring)."""

    renames: tuple[tuple[str, str], ...] = ()
    #: checkpoint name -> the name a runtime holds it under, before ``renames``
    names: Mapping[str, str] = field(default_factory=dict)
    rules: tuple[TensorRule, ...] = ()
    #: renamed checkpoint names (fnmatch) the runtime holds under no name of its own (e.g. a tied head it derives)
    not_held: tuple[str, ...] = ()
    #: loaded names (fnmatch) not read from the checkpoint (e.g. a tied head, a buffer made from the config)
    not_from_checkpoint: tuple[str, ...] = ()
    #: why the declaration is what it is, for the report (e.g. which layout a checkpoint's experts are in)
    notes: tuple[str, ...] = ()
    #: parts the runtime reads after its load, each audited when read, by name (``"text"``: the compiled path's
    #: decoder, read at the text capture), with the layout they are held in
    later: Mapping[str, LoadLayout] = field(default_factory=dict)
