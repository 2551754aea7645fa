"""Every key of the contract in code is described in the contract on paper, docs/design.md.

``gpushare/keys.py`` names each resource, label, annotation, namespace, Lease and container
that the parts agree on (``gpushare/rules.py`` the selectors built from them), and the
design says who writes each and who may believe it. A key added to the code and not to the
design is a rule nobody can review, so this test reads those modules and looks for each of
their public upper-case ``str`` constants in the design. It finds them by itself: a key
added later is checked without editing this file. The state file's name and timer kinds
(``controller/io/state.py``, design §9) are checked the same way.

"Described" means quoted as code (inside backticks, or a fenced block) as a whole token, so
that ``share`` is not found in ``gpushare/share-gpu-N``, ``main`` not in "maintain", and
``gpushare.k8s.io/drain`` not in ``gpushare.k8s.io/drained``. A value that ends in ``/``,
``-`` or ``.`` is a prefix that the design quotes with what follows it
(``gpushare/share-gpu-N``, ``gpushare.k8s.io/container-devices-from.<target>``).
"""

from __future__ import annotations

import importlib
import re
import types
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"

# The shared leaf's modules that hold contract strings. The leaf's other modules are left out
# because their constants are not keys between parts: the two tokens of the annotation
# grammar in ``codecs`` (``*``, ``_``) are values, the ``REFUSED_*`` of ``errors`` are the NRI
# plugin's refusal categories (docs/nri.md), ``config`` holds the config file's version, and
# ``ids`` and ``log`` hold none.
CONTRACT_MODULES = ("gpushare.keys", "gpushare.rules")
# What the state file keeps under which name (design §9): its file name and every timer kind.
STATE_MODULE = "controller.io.state"

_PUBLIC_CONSTANT = re.compile(r"^[A-Z][A-Z0-9_]*$")
# Characters that continue a key: a quoted value must not be glued to more of them.
_KEY_CHAR = r"[A-Za-z0-9_.-]"
_PREFIX_ENDS = ("/", "-", ".")
_FENCE = re.compile(r"^\s*(```|~~~)")
_INLINE_CODE = re.compile(r"`([^`\n]+)`")


def contract_modules() -> list[types.ModuleType]:
    """The contract modules that exist now (``gpushare.keys`` always does)."""
    found: list[types.ModuleType] = []
    for name in CONTRACT_MODULES:
        try:
            found.append(importlib.import_module(name))
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise  # the module exists but imports something missing: that is a real failure
    return found


def key_constants(modules: Iterable[types.ModuleType]) -> dict[str, str]:
    """``module.NAME`` -> value of every public upper-case ``str`` constant of ``modules``."""
    return {
        f"{module.__name__}.{name}": value
        for module in modules
        for name, value in sorted(vars(module).items())
        if _PUBLIC_CONSTANT.match(name) and isinstance(value, str)
    }


def code_text(markdown: str) -> list[str]:
    """Every inline code span and every line of a fenced block: where a design quotes a key."""
    spans: list[str] = []
    in_fence = False
    for line in markdown.splitlines():
        if _FENCE.match(line):
            in_fence = not in_fence
        elif in_fence:
            spans.append(line)
        else:
            spans.extend(m.group(1) for m in _INLINE_CODE.finditer(line))
    return spans


def is_quoted(value: str, spans: Iterable[str]) -> bool:
    """``value`` appears in one of ``spans`` as a whole token (a prefix may run on)."""
    tail = "" if value.endswith(_PREFIX_ENDS) else f"(?!{_KEY_CHAR})"
    pattern = re.compile(f"(?<!{_KEY_CHAR}){re.escape(value)}{tail}")
    return any(pattern.search(span) for span in spans)


def undescribed(constants: Mapping[str, str], markdown: str) -> list[str]:
    """One message per constant whose value the design does not quote."""
    spans = code_text(markdown)
    return [
        f"{name} = {value!r} is not in docs/design.md: describe it in the design's section for it "
        "(who writes it, who reads it, why it may be believed), quoted in backticks"
        for name, value in sorted(constants.items())
        if not is_quoted(value, spans)
    ]


def test_every_key_is_described_in_the_design() -> None:
    constants = key_constants(contract_modules())
    # Guard against a vacuous pass: the collection must see the keys this test was written against.
    assert {"gpushare.keys.LABEL_ROLE", "gpushare.keys.RESOURCE_SPOT_GPU", "gpushare.keys.LEASE_NAME"} <= set(
        constants
    ), f"the key constants were not found; found only {sorted(constants)}"
    missing = undescribed(constants, DESIGN.read_text())
    assert not missing, "keys of the contract missing from the design:\n" + "\n".join(missing)


def test_every_state_timer_is_described_in_the_design() -> None:
    constants = key_constants([importlib.import_module(STATE_MODULE)])
    assert any(name.rsplit(".", 1)[-1].startswith("TIMER_") for name in constants), (
        f"no timer kinds found in {STATE_MODULE}; found only {sorted(constants)}"
    )
    missing = undescribed(constants, DESIGN.read_text())
    assert not missing, "state file names missing from the design (§9):\n" + "\n".join(missing)


def test_the_check_catches_a_key_the_design_lacks() -> None:
    constants = {
        "keys.LABEL": "example.io/role",
        "keys.PREFIX": "example.io/share-",
        "keys.SHORT": "main",
        "keys.DRAIN": "example.io/drain",
        "keys.FROM": "example.io/from",
    }
    design = (
        "| label `example.io/role=shadow` | the pod |\n"
        "Resources `example.io/share-4`; the maintainers' main container.\n"
        "```\nexample.io/drained: yes\n```\n"
        "Pod annotation `example.io/from.<target>`.\n"
    )
    # "main" only in prose, "drain" only as part of "drained", "from" only as part of a longer key.
    assert undescribed(constants, design) == [
        f"{name} = {value!r} is not in docs/design.md: describe it in the design's section for it "
        "(who writes it, who reads it, why it may be believed), quoted in backticks"
        for name, value in sorted(constants.items())
        if name in ("keys.DRAIN", "keys.FROM", "keys.SHORT")
    ]
    # Quoted as whole tokens, they all pass.
    fixed = design + "`main`, `example.io/drain`, `example.io/from`\n"
    assert undescribed(constants, fixed) == []
    # And the collection finds a constant added to a module, whatever its name, and only str ones.
    module = types.ModuleType("made_up_keys")
    vars(module).update({"NEW_KEY": "example.io/new", "_PRIVATE": "x", "lower": "y", "NUMBER": 3})
    assert key_constants([module]) == {"made_up_keys.NEW_KEY": "example.io/new"}
