"""Property tests of the annotation parsing the NRI plugin does: any pod/container annotations give
an instruction, None, or InstructionRefused — never another exception (design §8)."""

from __future__ import annotations

import contextlib
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare import keys
from gpushare.codecs import parse_devices_from, parse_devices_ids, parse_same_pod_annotations
from gpushare.errors import InstructionRefused
from nri_plugin.decide import decide, find_instruction
from nri_plugin.model import ContainerInfo, PodInfo, RuntimeView

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=40), inner, max_size=4),
    max_leaves=12,
)
texts = st.text(max_size=200) | json_values.map(json.dumps)
keys_st = st.sampled_from(
    [
        keys.ANNOTATION_DEVICES_FROM,
        keys.ANNOTATION_DEVICES_IDS,
        keys.POD_ANNOTATION_DEVICES_FROM_PREFIX + "app",
        keys.POD_ANNOTATION_DEVICES_FROM_PREFIX + "x/y",
        "other",
    ]
)
annotations = st.dictionaries(keys_st, texts, max_size=4)


@settings(max_examples=400)
@given(texts)
def test_codecs_accept_or_refuse(value: str) -> None:
    for parse in (parse_devices_from, parse_devices_ids):
        with contextlib.suppress(InstructionRefused):
            parse(value)
    with contextlib.suppress(InstructionRefused):
        parse_same_pod_annotations({keys.POD_ANNOTATION_DEVICES_FROM_PREFIX + "app": value})


@settings(max_examples=400)
@given(annotations, annotations)
def test_find_instruction_and_decide_accept_or_refuse(pod_ann: dict[str, str], ctr_ann: dict[str, str]) -> None:
    pod = PodInfo("p", "pod", "ns", annotations=pod_ann)
    ctr = ContainerInfo("c", "p", "app", annotations=ctr_ann)
    try:
        instr = find_instruction(pod, ctr)
        if instr is not None:
            decide(instr, pod, ctr, RuntimeView(), allocated={})
    except InstructionRefused as exc:
        assert str(exc).startswith("gpushare:")
