"""podcgroups.paths on recorded /proc/<pid>/cgroup texts of both hierarchies and both drivers."""

from __future__ import annotations

import pytest

from podcgroups.errors import ProcessError
from podcgroups.paths import (
    CgroupDriver,
    CgroupVersion,
    PodPath,
    check_pod_uid,
    is_kubepods_name,
    parse_pod_path,
    parse_proc_cgroup,
    pod_dir_candidates,
)
from tests.unit.podcgroups.cgroup_fixtures import FIXTURES, proc_text

SD, FS = CgroupDriver.SYSTEMD, CgroupDriver.CGROUPFS
# file -> (version whose line is read, pod UID, QoS, driver, container ID); None: no pod's process.
RECORDED: dict[str, tuple[CgroupVersion, tuple[str, str, CgroupDriver, str | None] | None]] = {
    # Recorded on the development host (hybrid v1, local test cluster, kubelet cgroupRoot /gs-kwnu26x_o).
    "v1-hybrid-cgroupfs-besteffort.txt": (
        CgroupVersion.V1,
        (
            "b21b07d6-77b8-4372-b573-02d941d6112b",
            "besteffort",
            FS,
            "985f37db6c8b1111f6c56164311dcfa5be8765f26cfa9bebc071fc5a614a8725",
        ),
    ),
    "v1-host-process.txt": (CgroupVersion.V1, None),
    "v1-hybrid-systemd-burstable.txt": (
        CgroupVersion.V1,
        (
            "3fd95e98-4260-4ecd-9aa6-0e529944316c",
            "burstable",
            SD,
            "99c5fa44283d97c6e7ad682f75353d73013c9a5a5ae5e3c8734db83bbccfe760",
        ),
    ),
    "v1-legacy-systemd-guaranteed.txt": (
        CgroupVersion.V1,
        (
            "ae21398a-3d57-498f-a4d1-625873258f8a",
            "guaranteed",
            SD,
            "0d60a4b850ff97166267a7ec1cbb212fd25247b57e2bf279aadd9815890b2867",
        ),
    ),
    "v2-systemd-besteffort.txt": (
        CgroupVersion.V2,
        (
            "7852b09e-7246-4abe-85a4-d21a6156b4da",
            "besteffort",
            SD,
            "d7f25dce6c7a2d92bd294cf7583fdd92960c0cb31a8708bb0ba0cebf66755d7a",
        ),
    ),
    "v2-systemd-guaranteed.txt": (
        CgroupVersion.V2,
        (
            "44331c94-d567-4c73-bc5d-a0f24fc23d30",
            "guaranteed",
            SD,
            "2609e76a58b9d36ac02de7b927f1ca9fea44a55d6645993766e66a32fa09e8b6",
        ),
    ),
    "v2-systemd-pod-level.txt": (CgroupVersion.V2, ("7852b09e-7246-4abe-85a4-d21a6156b4da", "besteffort", SD, None)),
    "v2-cgroupfs-burstable.txt": (
        CgroupVersion.V2,
        (
            "ab03ee07-7397-4042-a632-601587dd2f69",
            "burstable",
            FS,
            "58160d5f24e4e4dbab3ef393f32dd3061046cb40deb2f4f7d213c0cdcdc02873",
        ),
    ),
    "v2-cgroupfs-guaranteed.txt": (
        CgroupVersion.V2,
        (
            "cfb213da-57d9-4538-b9c7-22498e2b48a9",
            "guaranteed",
            FS,
            "54b43009213511ac10b66084168bd9746670e0ea5b10982c92ab6e5faf571fbc",
        ),
    ),
    # What an agent in a private cgroup namespace reads for another pod's process: "/.." up to
    # the common ancestor, so kubepods itself is not in the path.
    "v2-systemd-cgroupns-relative.txt": (
        CgroupVersion.V2,
        (
            "ceffa969-0e80-4112-ac20-765f0aef39ff",
            "besteffort",
            SD,
            "1cb821b272416ea2ca353ff2d7b2153e9693e4bcf06202d505bfb7caa2752e2c",
        ),
    ),
    "v2-cgroupfs-cgroupns-relative.txt": (
        CgroupVersion.V2,
        (
            "0b534ead-b804-4836-b662-dd97ee220ae3",
            "besteffort",
            FS,
            "851c613702965427e5ad7da071893b9627e2e3a3457fc422971c33b6b130acdc",
        ),
    ),
    "v2-crio-systemd-burstable.txt": (
        CgroupVersion.V2,
        (
            "3fd95e98-4260-4ecd-9aa6-0e529944316c",
            "burstable",
            SD,
            "920313437b31c4bbf94f5d503936fa6879525da5a1761b0d49770c791b4bb4b7",
        ),
    ),
    "v2-host-service.txt": (CgroupVersion.V2, None),
    "v2-own-cgroup-namespace.txt": (CgroupVersion.V2, None),
}


def test_every_recorded_text_has_an_expectation() -> None:
    assert sorted(p.name for p in (FIXTURES / "proc").iterdir()) == sorted(RECORDED)


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_recorded_proc_cgroup_names_its_pod(name: str) -> None:
    version, expected = RECORDED[name]
    proc = parse_proc_cgroup(proc_text(name))
    path = proc.path_in(version, "freezer")
    assert path is not None
    pod = parse_pod_path(path)
    if expected is None:
        assert pod is None
        return
    assert pod is not None
    assert (pod.pod_uid, pod.qos, pod.driver, pod.container_id) == expected
    assert path.startswith(pod.pod_path) and pod.pod_path.rsplit("/", 1)[-1] in path


def test_v1_lines_are_keyed_by_each_hierarchy_and_the_unified_line_apart() -> None:
    hybrid = parse_proc_cgroup(proc_text("v1-hybrid-cgroupfs-besteffort.txt"))
    assert {"freezer", "pids", "memory", "systemd", "cpu", "cpuacct"} <= set(hybrid.v1)
    assert hybrid.unified == hybrid.v1["freezer"]  # runc joins the unified hierarchy of a hybrid host too
    legacy = parse_proc_cgroup(proc_text("v1-legacy-systemd-guaranteed.txt"))
    assert legacy.unified is None
    assert legacy.v1["cpu,cpuacct"] == legacy.v1["cpu"] == legacy.v1["cpuacct"] == legacy.v1["freezer"]
    assert legacy.path_in(CgroupVersion.V2, "freezer") is None
    v2 = parse_proc_cgroup(proc_text("v2-systemd-besteffort.txt"))
    assert v2.v1 == {} and v2.path_in(CgroupVersion.V1, "freezer") is None


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("garbage", "line 1"),
        ("1:cpu", "line 1"),
        ("0::/\nx:cpu:/", "line 2"),
        ("3::/foo", "names no controller"),
        ("1:cpu:relative/path", "line 1"),
    ],
)
def test_a_malformed_line_is_named(text: str, problem: str) -> None:
    with pytest.raises(ProcessError, match=problem):
        parse_proc_cgroup(text)


def test_empty_text_is_no_cgroup_at_all() -> None:
    proc = parse_proc_cgroup("")
    assert proc.v1 == {} and proc.unified is None


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        # A "pod<uid>" outside kubepods is someone else's directory.
        ("/system.slice/podman-pod1234.slice", None),
        ("/user/pod1234/x", None),
        ("/kubepods/besteffort", None),
        ("/kubepods.slice/kubepods-burstable.slice", None),
        ("/gs-kabc/kubepods/pod1234", PodPath("1234", "guaranteed", FS, "/gs-kabc/kubepods/pod1234", None)),
        (
            "/x.slice/x-kubepods.slice/x-kubepods-besteffort.slice/x-kubepods-besteffort-pod12_ab.slice/docker-beef.scope",
            PodPath(
                "12-ab",
                "besteffort",
                SD,
                "/x.slice/x-kubepods.slice/x-kubepods-besteffort.slice/x-kubepods-besteffort-pod12_ab.slice",
                "beef",
            ),
        ),
        ("/../pod77/c1", PodPath("77", "", FS, "/../pod77", "c1")),
    ],
)
def test_pod_paths(path: str, expected: PodPath | None) -> None:
    assert parse_pod_path(path) == expected


def test_candidates_follow_kubelets_naming_for_each_qos() -> None:
    uid = "7852b09e-7246-4abe-85a4-d21a6156b4da"
    assert pod_dir_candidates("kubepods", FS, uid) == [
        f"besteffort/pod{uid}",
        f"burstable/pod{uid}",
        f"pod{uid}",
    ]
    u = uid.replace("-", "_")
    assert pod_dir_candidates("kubepods.slice", SD, uid) == [
        f"kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice",
        f"kubepods-burstable.slice/kubepods-burstable-pod{u}.slice",
        f"kubepods-pod{u}.slice",
    ]
    # A kubelet cgroupRoot "gs.slice" makes every level carry its prefix.
    assert pod_dir_candidates("gs-kubepods.slice", SD, uid)[2] == f"gs-kubepods-pod{u}.slice"


def test_every_candidate_parses_back_to_the_same_pod() -> None:
    uid = "cfb213da-57d9-4538-b9c7-22498e2b48a9"
    for top, driver in (("kubepods", FS), ("kubepods.slice", SD), ("r-kubepods.slice", SD)):
        qos_order = ("besteffort", "burstable", "guaranteed")
        for rel, qos in zip(pod_dir_candidates(top, driver, uid), qos_order, strict=True):
            pod = parse_pod_path(f"/{top}/{rel}/ctr")
            assert pod is not None and (pod.pod_uid, pod.qos, pod.driver, pod.container_id) == (uid, qos, driver, "ctr")


@pytest.mark.parametrize("bad", ["", "../x", "a/b", "-lead", "sp ace"])
def test_a_uid_that_is_no_path_component_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="not a pod UID"):
        check_pod_uid(bad)


@pytest.mark.parametrize(
    ("name", "driver"),
    [
        ("kubepods", FS),
        ("kubepods.slice", SD),
        ("gs-kubepods.slice", SD),
        ("kubepods-besteffort.slice", None),
        ("mykubepods", None),
        ("kubepods.scope", None),
    ],
)
def test_kubepods_names(name: str, driver: CgroupDriver | None) -> None:
    assert is_kubepods_name(name) is driver
