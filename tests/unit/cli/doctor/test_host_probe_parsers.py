"""Property tests of every parser `gpushare doctor` feeds with host input: any input gives a value or ValueError."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from cli.doctor import host_probe as probe
from cli.doctor.diagnosis import parse_version

# What tomllib and yaml.safe_load can hand over: nested tables of scalars and lists.
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20))
documents = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)),
    max_leaves=20,
)
keys = st.sampled_from(["plugins", "io.containerd.nri.v1.nri", "disable", "socket_path", "version", "runc", "options"])
containerd_docs = st.recursive(
    scalars,
    lambda inner: st.dictionaries(st.one_of(keys, st.text(max_size=8)), inner, max_size=4),
    max_leaves=20,
)


@given(st.text())
def test_parse_version_never_raises(text: str) -> None:
    version = parse_version(text)
    assert version is None or (len(version) == 3 and all(isinstance(n, int) and n >= 0 for n in version))


@given(
    st.lists(st.text(max_size=12), max_size=8), st.lists(st.sampled_from(["--config", "-c", "--root-dir"]), min_size=1)
)
def test_flag_value_is_an_argument_or_none(argv: list[str], names: list[str]) -> None:
    value = probe.flag_value(argv, *names)
    assert value is None or any(value == a or a.endswith("=" + value) for a in argv)


@given(st.text())
def test_mountinfo_never_raises(text: str) -> None:
    mounts = probe.parse_mountinfo(text)
    assert all(isinstance(point, str) and fs for point, fs in mounts)
    assert probe.cgroup_version(mounts, "/sys/fs/cgroup") in (None, "v1", "v2", "hybrid")


@given(containerd_docs, st.one_of(st.none(), st.integers(0, 3)))
def test_containerd_settings_from_any_document(doc: Any, major: int | None) -> None:
    if not isinstance(doc, dict):
        doc = {"plugins": doc}
    disabled, socket, systemd = probe.containerd_settings(doc, major)
    assert disabled in (None, True, False) and isinstance(socket, str) and socket and systemd in (True, False)


@given(documents, st.lists(st.text(max_size=12), max_size=6))
def test_kubelet_settings_from_any_document(doc: Any, argv: list[str]) -> None:
    driver, root = probe.kubelet_settings(doc, argv)
    assert isinstance(driver, str) and isinstance(root, str)
