"""Failing closed: a sharer's container is not created while gpushare's NRI plugin is down.

containerd 2.x here runs its built-in NRI default validator with nothing required node-wide, so
only a container whose pod carries NRI's ``required-plugins.noderesource.dev/container.<name>``
annotation waits for gpushare; every other container is created as before. containerd 1.7.24 has
no validator: the same sharer is created without its GPU (fail open), which docs/nri.md states and
these tests hold it to. The CriClient plays kubelet: a failed CreateContainer is simply asked again.

A sharer here is what kubelet makes of one: the share plugin's ``container-devices-from`` as a
container annotation, and a real gRPC PodResources server standing in for kubelet's allocation.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpushare import keys
from gpushare.codecs import encode_devices_from
from gpushare.ids import virtual_ids_of
from localcluster.containerd import Containerd, ContainerdInstall, InstallMissing, find_install
from localcluster.containerd_config import (
    NRI_REQUIRED_PLUGINS_ANNOTATION,
    Paths,
    RequiredPlugins,
    render_config,
    render_nri_validator,
)
from localcluster.cri import CriClient, CriError, Pod
from localcluster.host import pids_mentioning
from tests.harness.devices import FakeDevice
from tests.harness.plugin_process import READY_LINE, PluginProcess
from tests.harness.podresources_server import PodResourcesServer
from tests.integration.containerd.common import GPU_ID, Seen, expected_node, probe, run_source

REQUIRES_GPUSHARE = '["gpushare"]'
TOLERATE = "tolerate-missing-nri-plugins.noderesource.dev"
VALIDATOR_REFUSAL = 'rejected container adjustment, reason: validation error: required plugin "gpushare" not present'
NOTHING = Seen("", can_open=False, cgroup_allows=False, visible_env=None)
RESOURCE = keys.share_resource(keys.KIND_SHARE, 4)


def requires_gpushare(container: str) -> dict[str, str]:
    return {f"{NRI_REQUIRED_PLUGINS_ANNOTATION}/container.{container}": REQUIRES_GPUSHARE}


@pytest.fixture(scope="module")
def containerd(containerd_install: ContainerdInstall) -> Iterator[Containerd]:
    """This module's containerd, the validator on and nothing required node-wide. 1.7.24 is given
    the very table 2.x reads, to show that it starts and ignores it."""
    as_v2 = ContainerdInstall("2.x", containerd_install.bin_dir)
    extra = render_nri_validator(as_v2, RequiredPlugins())
    with Containerd(containerd_install, nri=True, extra_config=extra) as cd:
        yield cd


@pytest.fixture
def podres() -> Iterator[PodResourcesServer]:
    with PodResourcesServer() as server:
        yield server


@dataclass
class Sharer:
    """A sharer pod whose container `app` kubelet was allocated one slot of a shadow on this node."""

    shadow: Pod
    pod: Pod
    annotation: dict[str, str]  # what the share plugin's Allocate gave the container

    def create_app(self, cri: CriClient, attempt: int = 0) -> str:
        return cri.create_container(self.pod, "app", annotations=self.annotation, attempt=attempt)


def make_sharer(
    cri: CriClient, podres: PodResourcesServer, fake_gpu: FakeDevice, name: str, pod_annotations: dict[str, str]
) -> Sharer:
    shadow_name = f"shadow-{name}"
    shadow = cri.run_pod(
        shadow_name,
        keys.DEFAULT_NAMESPACE,
        labels={keys.LABEL_ROLE: keys.ROLE_SHADOW, keys.LABEL_SHARE_SPEC: "4", keys.LABEL_SHARE_KIND: keys.KIND_SHARE},
    )
    run_source(cri, shadow, fake_gpu, name=keys.SHADOW_CONTAINER)
    vids = virtual_ids_of(keys.DEFAULT_NAMESPACE, shadow_name, 4)[:1]
    podres.allocate("team-a", name, "app", RESOURCE, vids)
    annotation = {keys.ANNOTATION_DEVICES_FROM: encode_devices_from(keys.DEFAULT_NAMESPACE, shadow_name, vids)}
    return Sharer(shadow, cri.run_pod(name, "team-a", annotations=pod_annotations), annotation)


def remove(cri: CriClient, *pods: Pod) -> None:
    for pod in pods:
        cri.remove_pod(pod.id)


def gpushare_plugin(containerd: Containerd, podres: PodResourcesServer) -> PluginProcess:
    return PluginProcess.gpushare(containerd, pod_resources_socket=podres.socket)


def runs(cri: CriClient, container_id: str) -> bool:
    cri.start_container(container_id)
    return cri.exec_sync(container_id, ["true"]).exit_code == 0


def test_sharer_waits_for_the_plugin_and_plain_pods_do_not(
    containerd: Containerd, cri: CriClient, podres: PodResourcesServer, fake_gpu: FakeDevice
) -> None:
    """2.x: refused while down, again on kubelet's retry, created with its GPU once the plugin is back.
    1.7.24: created at once without the GPU (no validator: the annotation means nothing to it)."""
    sharer = make_sharer(cri, podres, fake_gpu, "sharer-waits", requires_gpushare("app"))
    gpu = Seen(expected_node(fake_gpu), can_open=True, cgroup_allows=True, visible_env=GPU_ID)
    if containerd.install.is_v2:
        for _retry in range(2):
            with pytest.raises(CriError) as info:
                sharer.create_app(cri)
            assert VALIDATOR_REFUSAL in info.value.details, info.value.details
    else:
        app = sharer.create_app(cri)
        cri.start_container(app)
        assert probe(cri, app, fake_gpu) == NOTHING  # fail open: running, without its GPU
        assert "validator" not in containerd.log_text().lower()  # the table was accepted without a word
    # Nothing else waits: another container of the same pod, and a plain pod.
    assert runs(cri, cri.create_container(sharer.pod, "sidecar"))
    plain = cri.run_pod("plain-while-down")
    assert runs(cri, cri.create_container(plain, "app"))

    with gpushare_plugin(containerd, podres):
        app = sharer.create_app(cri, attempt=0 if containerd.install.is_v2 else 1)
        cri.start_container(app)
        assert probe(cri, app, fake_gpu) == gpu
        # "<index>-<name>" names the same plugin.
        indexed = cri.run_pod("indexed", annotations={f"{NRI_REQUIRED_PLUGINS_ANNOTATION}/pod": '["10-gpushare"]'})
        assert runs(cri, cri.create_container(indexed, "app"))
    remove(cri, sharer.pod, sharer.shadow, plain, indexed)


def test_requirement_is_read_from_the_pod_sandbox_only(cri: CriClient) -> None:
    """The annotation among the container's annotations (where a device plugin's Allocate puts its
    annotations, through kubelet) requires nothing: the container is created with the plugin down."""
    pod = cri.run_pod("required-on-container")
    app = cri.create_container(pod, "app", annotations={NRI_REQUIRED_PLUGINS_ANNOTATION: REQUIRES_GPUSHARE})
    assert runs(cri, app)
    remove(cri, pod)


def test_a_plugin_that_hangs_during_the_call_lets_that_one_container_through(
    containerd: Containerd, cri: CriClient, podres: PodResourcesServer, fake_gpu: FakeDevice
) -> None:
    """The validator counts the plugins connected when CreateContainer began. One that times out in
    the call is dropped, and the container is created without its GPU on every version; on 2.x the
    next one is refused, and the plugin, once it runs again, reconnects and serves the retry."""
    first = make_sharer(cri, podres, fake_gpu, "sharer-hung", requires_gpushare("app"))
    second = make_sharer(cri, podres, fake_gpu, "sharer-after-hang", requires_gpushare("app"))
    with gpushare_plugin(containerd, podres) as plugin:
        (pid,) = pids_mentioning(containerd.nri_socket)
        mark = plugin.mark()
        os.kill(pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            hung = first.create_app(cri)
            waited_s = time.monotonic() - t0
            registered = plugin.registrations()  # the create reached the plugin: it was added
            if containerd.install.is_v2:
                with pytest.raises(CriError) as info:
                    second.create_app(cri)
                assert VALIDATOR_REFUSAL in info.value.details, info.value.details
        finally:
            os.kill(pid, signal.SIGCONT)
        assert waited_s >= 1.5, f"created after {waited_s:.2f} s: containerd did not wait for the plugin"
        cri.start_container(hung)
        assert probe(cri, hung, fake_gpu) == NOTHING
        plugin.wait_for(READY_LINE, since=mark, timeout_s=30)
        plugin.wait_registered(more_than=registered)  # containerd adds it after its Synchronize returns
        retry = second.create_app(cri)
        cri.start_container(retry)
        assert probe(cri, retry, fake_gpu).cgroup_allows
    remove(cri, first.pod, first.shadow, second.pod, second.shadow)


# --- 2.x only: the validator off, and the node-wide requirement docs/nri.md weighs ---------------------


@pytest.fixture(scope="module")
def v2_install() -> ContainerdInstall:
    if os.geteuid() != 0:
        pytest.skip("containerd tier needs root (runc, mounts, cgroups); run `sudo make test`")
    try:
        return find_install("2.x")
    except InstallMissing as exc:
        pytest.skip(str(exc))


@contextlib.contextmanager
def required_everywhere(install: ContainerdInstall) -> Iterator[tuple[Containerd, CriClient]]:
    extra = render_nri_validator(install, RequiredPlugins(everywhere=("gpushare",), tolerate_annotation=TOLERATE))
    with (
        Containerd(install, nri=True, extra_config=extra) as cd,
        CriClient(cd.address, cgroup_parent=cd.cgroup_parent) as cri,
    ):
        yield cd, cri


def test_without_the_validator_2x_fails_open_too(
    v2_install: ContainerdInstall, podres: PodResourcesServer, fake_gpu: FakeDevice
) -> None:
    """`enable` defaults to false: the annotation alone changes nothing, as on 1.7."""
    with Containerd(v2_install, nri=True) as cd, CriClient(cd.address, cgroup_parent=cd.cgroup_parent) as cri:
        sharer = make_sharer(cri, podres, fake_gpu, "sharer-no-validator", requires_gpushare("app"))
        app = sharer.create_app(cri)
        cri.start_container(app)
        assert probe(cri, app, fake_gpu) == NOTHING


def test_required_everywhere_stops_every_container_but_the_tolerated(
    v2_install: ContainerdInstall, podres: PodResourcesServer
) -> None:
    """`required_plugins = ["gpushare"]`: a plain pod waits too, unless it tolerates the absence
    (pod-wide or for one container); with the plugin up everything is created."""
    with required_everywhere(v2_install) as (cd, cri):
        plain = cri.run_pod("plain")
        with pytest.raises(CriError) as info:
            cri.create_container(plain, "app")
        assert VALIDATOR_REFUSAL in info.value.details, info.value.details

        tolerant = cri.run_pod("tolerant", annotations={TOLERATE: "true"})
        assert runs(cri, cri.create_container(tolerant, "app"))
        one = cri.run_pod("one-tolerant", annotations={f"{TOLERATE}/container.agent": "true"})
        assert runs(cri, cri.create_container(one, "agent"))
        with pytest.raises(CriError):
            cri.create_container(one, "app")

        with gpushare_plugin(cd, podres):
            assert runs(cri, cri.create_container(plain, "app"))
            assert runs(cri, cri.create_container(one, "app"))


# --- the config option itself (no containerd needed) -----------------------------------------------

V1 = ContainerdInstall("1.7.24", Path("/nonexistent"))
V2 = ContainerdInstall("2.x", Path("/nonexistent"))
PATHS = Paths(Path("/tmp/gs-cd-render"))


def test_default_config_has_no_validator() -> None:
    for inst in (V1, V2):
        assert "default_validator" not in render_config(inst, PATHS)


def test_validator_table_parses_into_the_nri_section() -> None:
    extra = render_nri_validator(V2, RequiredPlugins(everywhere=("gpushare", "05-other"), tolerate_annotation=TOLERATE))
    parsed = tomllib.loads(render_config(V2, PATHS, extra=extra))
    assert parsed["plugins"]["io.containerd.nri.v1.nri"]["default_validator"] == {
        "enable": True,
        "required_plugins": ["gpushare", "05-other"],
        "tolerate_missing_plugins_annotation": TOLERATE,
    }
    only_annotated = tomllib.loads(render_config(V2, PATHS, extra=render_nri_validator(V2, RequiredPlugins())))
    assert only_annotated["plugins"]["io.containerd.nri.v1.nri"]["default_validator"]["required_plugins"] == []


@pytest.mark.parametrize(
    ("inst", "required", "message"),
    [
        (V1, RequiredPlugins(), "containerd 1.7.24 has no NRI validator"),
        (V2, RequiredPlugins(everywhere=('gpu"share',)), "required plugin names"),
        (V2, RequiredPlugins(everywhere=("",)), "required plugin names"),
        (V2, RequiredPlugins(tolerate_annotation="a/b/c"), "not a Kubernetes annotation key"),
    ],
    ids=["containerd-1.7", "quote-in-name", "empty-name", "bad-annotation-key"],
)
def test_validator_refuses_what_cannot_work(inst: ContainerdInstall, required: RequiredPlugins, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        render_nri_validator(inst, required)
