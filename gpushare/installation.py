"""The namespace gpushare is installed in: its agents', its shadow pods' and its Lease's.

Helm installs the chart into the release's namespace, and the chart writes that name into the
agent's config (``namespace``). A shadow is trusted as one only there (``rules.is_shadow``), so
the name is part of the trust rules and must be the same for every part on a node.

It is fixed for a process's life: each command sets it once from its config or flags before it
starts a thread or reads a pod, and nothing changes it after. A module value rather than a
parameter because it is, like the resource names in ``keys``, a constant of the installation
that every rule compares against, not data a decision is about.
"""

from __future__ import annotations

import re

from gpushare import keys

__all__ = ["check_namespace", "namespace", "use_namespace"]

# A namespace's name is a DNS-1123 label (the API refuses anything else).
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")

_namespace: str = keys.DEFAULT_NAMESPACE


def check_namespace(name: str) -> None:
    """``ValueError`` saying why ``name`` cannot be a namespace's name."""
    if not _DNS_LABEL.fullmatch(name):
        raise ValueError(
            f"{name!r} is not a namespace name: at most 63 lower-case letters, digits and '-', "
            "starting and ending with a letter or digit"
        )


def namespace() -> str:
    """Where this installation's agents, shadows and Lease live."""
    return _namespace


def use_namespace(name: str) -> None:
    """Set the installation's namespace for this process (once, at start)."""
    global _namespace  # noqa: PLW0603 - set once at start, read everywhere after (module docstring)
    check_namespace(name)
    _namespace = name
