"""Shares placed by the real scheduler on gpushare's published devices, prepared by real kubelet
through gpushare's DRA plugin, applied by real containerd from CDI specs."""

from __future__ import annotations

import random
import re
from collections import defaultdict
from fractions import Fraction
from typing import Any

from draplugin.claims import parse_quantity
from localcluster.cluster import Cluster
from tests.harness.worlds.dra import DRIVER, DraNode
from tests.integration.dra.conftest import NAMESPACE, Api, claim, claim_pod, results, share_pod

_DEVICE = re.compile(r"^(?P<gpu>gpu-\d+)(?:-(?P<kind>share|dev)(?P<n>\d+)-\d+|-(?P<other>exact|spot))?$")


def gpu_load(claims: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per GPU: what its allocated devices add up to, from the claims' allocations in the API."""
    load: dict[str, dict[str, Any]] = defaultdict(lambda: {"fraction": Fraction(0), "exact": 0, "families": set()})
    taken: dict[str, str] = {}
    for c in claims:
        for r in results(c):
            m = _DEVICE.match(r["device"])
            assert m, f"allocated device {r['device']} is not one gpushare publishes"
            gpu = load[m["gpu"]]
            if m["other"] == "spot":
                continue
            if m["other"] == "exact":
                gpu["exact"] += int(parse_quantity(r["consumedCapacity"]["milli"]))
                gpu["families"].add("exact")
                continue
            holder = taken.setdefault(r["device"], c["metadata"]["uid"])
            assert holder == c["metadata"]["uid"], f"{r['device']} allocated to two claims"
            gpu["fraction"] += Fraction(1, int(m["n"])) if m["n"] else Fraction(1)
            gpu["families"].add("slots")
    return load


def assert_never_over(claims: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    load = gpu_load(claims)
    for name, gpu in load.items():
        assert gpu["fraction"] <= 1, f"{name} holds {gpu['fraction']} of a GPU in slots"
        assert gpu["exact"] <= 1000, f"{name} holds {gpu['exact']} milli in exact claims"
        assert len(gpu["families"]) <= 1, f"{name} holds exact claims and slots at once"
    return load


def test_the_node_publishes_its_pool_and_the_api_accepts_it(dra: DraNode) -> None:
    slices = dra.slices()
    counters = [cs for s in slices for cs in s["spec"].get("sharedCounters", [])]
    assert sorted(cs["name"] for cs in counters) == ["gpu-0", "gpu-1"]
    assert all(
        cs["counters"]["milli"]["value"] == "1k" or cs["counters"]["milli"]["value"] == "1000" for cs in counters
    )
    devices = {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}
    assert {"gpu-0", "gpu-0-exact", "gpu-0-spot", "gpu-1-share4-4", "gpu-1-dev16-16"} <= set(devices)
    assert devices["gpu-0-exact"]["allowMultipleAllocations"] is True
    assert {s["spec"]["pool"]["name"] for s in slices} == {dra.cluster.node_name}
    owners = {o["kind"] for s in slices for o in s["metadata"]["ownerReferences"]}
    assert owners == {"Node"}


def test_share_gpu_4_pods_run_without_shadow_pods(dra: DraNode, api: Api, cluster: Cluster) -> None:
    names = [f"sharer-{i}" for i in range(4)]
    for n in names:
        api.apply(share_pod(n, 4))
    api.wait_running(names)
    shadows = cluster.request("GET", "/api/v1/pods?labelSelector=gpushare.k8s.io/role%3Dshadow")["items"]
    assert shadows == []
    gpus = set()
    for n in names:
        pod = api.pod(n)
        status = pod["status"]["extendedResourceClaimStatus"]
        got = api.claim(status["resourceClaimName"])
        (result,) = results(got)
        assert re.match(r"^gpu-\d-share4-\d$", result["device"]), result
        env = dict(line.split("=", 1) for line in api.exec(n, "env").splitlines() if "=" in line)
        assert env["GPUSHARE_GPU_MILLI"] == "250" and env["GPUSHARE_SHARE_KIND"] == "share"
        gpu = env["GPUSHARE_GPU"]
        # The vendor's own edits for that GPU: its device node and its variable, nothing else's.
        fake = f"fakegpu{gpu.removeprefix('gpu-')}"
        assert env["FAKE_VISIBLE_DEVICES"] == fake
        assert api.exec(n, "ls", "/dev").split().count(fake) == 1
        assert not {f"fakegpu{i}" for i in range(2)} - {fake} & set(api.exec(n, "ls", "/dev").split())
        gpus.add(gpu)
    assert_never_over(api.claims())
    # Four quarters fill one GPU: the scheduler packs them (the first GPU's slots come first).
    assert len(gpus) == 1, gpus
    api.delete_pods(*names)


def test_an_exact_milli_claim_gets_its_size(dra: DraNode, api: Api) -> None:
    api.apply(claim("exact-810", "exact.gpushare.k8s.io", milli=810))
    api.apply(claim("exact-190", "exact.gpushare.k8s.io", milli=190))
    api.apply(claim_pod("exact-a", "exact-810"))
    api.apply(claim_pod("exact-b", "exact-190"))
    api.wait_running(["exact-a", "exact-b"])
    a, b = api.claim("exact-810"), api.claim("exact-190")
    (ra,), (rb,) = results(a), results(b)
    assert parse_quantity(ra["consumedCapacity"]["milli"]) == 810
    assert ra["shareID"] and rb["shareID"] and ra["shareID"] != rb["shareID"]
    assert "GPUSHARE_GPU_MILLI=810" in api.exec("exact-a", "env")
    assert "GPUSHARE_GPU_MILLI=190" in api.exec("exact-b", "env")
    # 810 + 190 fill a GPU exactly: one exact device holds both.
    assert ra["device"] == rb["device"]
    assert_never_over(api.claims())
    api.delete_pods("exact-a", "exact-b")
    api.cluster.kubectl("delete", "resourceclaim", "-n", NAMESPACE, "exact-810", "exact-190")


def test_the_consumable_capacity_bugs_of_1_34_and_1_35_are_not_here(dra: DraNode, api: Api) -> None:
    """Two allocator bugs the DRA facts name, on the devices gpushare publishes:

    - kubernetes#134100: a multi-allocatable device that consumes counters could not take a
      second claim (its counters were checked again and found spent): 300 and 300 share a device;
    - kubernetes#133705: with the first device partly taken, the allocator did not go on to the
      next one: 600 then does not fit there and must land on the other GPU's exact device.
    """
    for name, milli in (("cc-a", 300), ("cc-b", 300), ("cc-c", 600)):
        api.apply(claim(name, "exact.gpushare.k8s.io", milli=milli))
        api.apply(claim_pod(name, name))
        api.wait_running([name])
    (a,), (b,), (c,) = (results(api.claim(n)) for n in ("cc-a", "cc-b", "cc-c"))
    assert a["device"] == b["device"], (a, b)
    assert c["device"] != a["device"] and c["device"].endswith("-exact"), (a, c)
    assert_never_over(api.claims())
    api.delete_pods("cc-a", "cc-b", "cc-c")
    api.cluster.kubectl("delete", "resourceclaim", "-n", NAMESPACE, "cc-a", "cc-b", "cc-c")


def test_random_claims_are_never_placed_over_a_gpu(dra: DraNode, api: Api) -> None:
    """Random sequences of every kind of claim: from the API, no GPU ever holds more than itself,
    and a claim waits only when no GPU has room of its kind."""
    rng = random.Random(20261206)
    for round_ in range(3):
        made: list[str] = []
        for i in range(10):
            kind = rng.choice(["whole", "share", "share", "dev", "exact", "exact"])
            name = f"r{round_}-{i}"
            if kind == "whole":
                api.apply(claim(name, "gpu.gpushare.k8s.io"))
            elif kind == "share":
                api.apply(claim(name, f"share-gpu-{rng.choice([2, 3, 4, 5])}.gpushare.k8s.io"))
            elif kind == "dev":
                api.apply(claim(name, f"share-dev-gpu-{rng.choice([2, 4, 8, 16])}.gpushare.k8s.io"))
            else:
                api.apply(claim(name, "exact.gpushare.k8s.io", milli=rng.randint(1, 1000)))
            api.apply(claim_pod(name, name))
            made.append(name)
        api.cluster.wait_for("every pod scheduled or found unschedulable", lambda made=made: _settled(api, made), 120)
        load = assert_never_over(api.claims())
        for name in made:
            if api.pod(name)["status"].get("phase") != "Running":
                assert _no_room(api.claim(name), load), f"{name} waits although a GPU has room for it"
        api.delete_pods(*made)
        api.cluster.kubectl("delete", "resourceclaim", "-n", NAMESPACE, *made)


def _settled(api: Api, names: list[str]) -> bool:
    for p in api.pods():
        if p["metadata"]["name"] not in names:
            continue
        status = p.get("status", {})
        unschedulable = any(
            c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable" for c in status.get("conditions", [])
        )
        if status.get("phase") != "Running" and not unschedulable:
            return False
    return True


def _no_room(obj: dict[str, Any], load: dict[str, dict[str, Any]]) -> bool:
    """Whether no GPU could take this (unallocated) claim, given what the others hold."""
    exactly = obj["spec"]["devices"]["requests"][0]["exactly"]
    cls = exactly["deviceClassName"]
    for g in ("gpu-0", "gpu-1"):
        gpu = load.get(g, {"fraction": Fraction(0), "exact": 0, "families": set()})
        if cls.startswith("exact."):
            want = int(exactly["capacity"]["requests"]["milli"])
            if "slots" not in gpu["families"] and gpu["exact"] + want <= 1000:
                return False
        else:
            m = re.search(r"gpu-(\d+)\.", cls)
            share = Fraction(1, int(m[1])) if m else Fraction(1)
            if "exact" not in gpu["families"] and gpu["fraction"] + share <= 1:
                return False
    return True


def test_claims_survive_a_kubelet_restart(dra: DraNode, api: Api, cluster: Cluster) -> None:
    api.apply(share_pod("keep-a", 2))
    api.wait_running(["keep-a"])
    before = dra.checkpoint["claims"]
    generation = dra.slices()[0]["spec"]["pool"]["generation"]
    cluster.restart_kubelet()
    # kubelet wipes the node's slices at start; the plugin publishes them again, newer.
    dra.wait_published(newer_than=generation)
    assert dra.checkpoint["claims"] == before
    api.apply(share_pod("keep-b", 2))
    api.wait_running(["keep-a", "keep-b"])
    assert_never_over(api.claims())
    api.delete_pods("keep-a", "keep-b")
    cluster.wait_for("claims unprepared", lambda: dra.checkpoint["claims"] == {}, 90)
    assert dra.claim_specs() == []


def test_claims_survive_a_plugin_crash(dra: DraNode, api: Api) -> None:
    api.apply(share_pod("crash-a", 3))
    api.wait_running(["crash-a"])
    before = dra.checkpoint["claims"]
    specs = dra.claim_specs()
    assert len(before) == 1 and len(specs) == 1
    dra.stop_plugin(kill=True)
    dra.start_plugin()
    assert dra.checkpoint["claims"] == before and dra.claim_specs() == specs
    api.apply(share_pod("crash-b", 3))
    api.wait_running(["crash-a", "crash-b"])
    api.delete_pods("crash-a", "crash-b")
    api.cluster.wait_for("claims unprepared", lambda: dra.checkpoint["claims"] == {}, 90)
    assert dra.claim_specs() == []
    assert DRIVER in dra.slices()[0]["spec"]["driver"]
    # The plugin started here ends here: the module's teardown has nothing left to stop.
    dra.stop_plugin()
