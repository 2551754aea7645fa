"""Property tests for the cgroup path parsers: any text gives a value or ProcessError; any path a pod or None;
every directory kubelet would make for a pod parses back to that pod."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from podcgroups.errors import ProcessError
from podcgroups.paths import (
    CgroupDriver,
    ProcCgroup,
    parse_pod_path,
    parse_proc_cgroup,
    pod_dir_candidates,
)

_ALNUM = st.characters(categories=["Ll", "Lu", "Nd"], max_codepoint=127)
UIDS = st.one_of(st.uuids().map(str), st.text(_ALNUM, min_size=1, max_size=40))
CONTAINER_IDS = st.text("0123456789abcdef", min_size=1, max_size=64)
LINES = st.one_of(
    st.text(),
    st.builds(
        lambda i, c, p: f"{i}:{c}:{p}",
        st.integers(0, 20),
        st.sampled_from(["", "freezer", "cpu,cpuacct", "name=systemd", "pids"]),
        st.text(),
    ),
)


@settings(max_examples=200)
@given(lines=st.lists(LINES, max_size=8))
def test_any_proc_cgroup_text_parses_or_names_its_line(lines: list[str]) -> None:
    try:
        result = parse_proc_cgroup("\n".join(lines))
    except ProcessError as exc:
        assert "line " in str(exc)
        return
    assert isinstance(result, ProcCgroup)
    assert all(path.startswith("/") for path in result.v1.values())


@settings(max_examples=200)
@given(path=st.one_of(st.text(), st.lists(st.text(max_size=30), max_size=8).map("/".join)))
def test_any_path_is_a_pod_or_none(path: str) -> None:
    pod = parse_pod_path(path)
    if pod is not None:
        assert pod.pod_uid and path.startswith(pod.pod_path)
        assert pod.qos in ("guaranteed", "burstable", "besteffort", "")


@settings(max_examples=200)
@given(
    uid=UIDS,
    driver=st.sampled_from(list(CgroupDriver)),
    root=st.sampled_from(["", "/gs-kabc", "/r.slice"]),
    container=CONTAINER_IDS,
)
def test_every_pod_directory_parses_back_to_its_pod(uid: str, driver: CgroupDriver, root: str, container: str) -> None:
    top = "kubepods" if driver is CgroupDriver.CGROUPFS else ("r-kubepods.slice" if root else "kubepods.slice")
    name = container if driver is CgroupDriver.CGROUPFS else f"cri-containerd-{container}.scope"
    for rel, qos in zip(pod_dir_candidates(top, driver, uid), ("besteffort", "burstable", "guaranteed"), strict=True):
        pod = parse_pod_path(f"{root}/{top}/{rel}/{name}")
        assert pod is not None
        assert pod.pod_uid == uid  # systemd's "_" for "-" is undone
        assert (pod.qos, pod.driver, pod.container_id) == (qos, driver, container)
        assert pod.pod_path == f"{root}/{top}/{rel}"
