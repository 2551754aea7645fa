"""The values each vendor's exporter writes where nothing was measured or the device does not
support the reading. Every one of them reads as unknown (None), never as a number; the table in
docs/metrics.md ("Sentinels") names the upstream source of each.

Shared by every adapter (``TableAdapter.clean``): NaN, ±Inf, negatives (the "unsupported" -1
of Enflame, Cambricon and Ascend, Cambricon's -100), utilization above 100, and the words of
``promtext.UNAVAILABLE_WORDS`` (``N/A``, ``[Not Supported]``, DCGM's ``<<<NULL>>>`` …), which
the parser reads as NaN.

Per vendor, here: plain numbers only, no I/O.
"""

from __future__ import annotations

# NVIDIA DCGM (dcgmlib/dcgm_structs.h): each type's blank is a base value and the next few
# values mean blank, not found, not supported, not permissioned. dcgm-exporter skips them in
# recent releases (internal/pkg/collector/utils.go) but older ones printed them as numbers.
DCGM_INT32_BLANK = 0x7FFFFFF0  # 2147483632; the int32 family runs to 0x7fffffff
DCGM_INT32_MAX = 0x7FFFFFFF
DCGM_INT64_BLANK = float(0x7FFFFFFFFFFFFFF0)  # 9223372036854775792
DCGM_FP64_BLANK = float(2**47)  # 140737488355328.0


def is_dcgm_blank(raw: float) -> bool:
    # Every int64 blank is far above 2**47, so one comparison covers fp64 and int64 blanks.
    return DCGM_INT32_BLANK <= raw <= DCGM_INT32_MAX or raw >= DCGM_FP64_BLANK


# AMD device-metrics-exporter (pkg/exporter/utils/utils.go, IsValueApplicable): the all-ones value of
# the field's width means "not applicable". Releases before that check exported them as numbers.
# uint8's 255 is left out: 255 W and 255 MiB are real readings (255 % is caught as above 100).
# float32 rounds uint32's all-ones up to 2**32, which the exporter also treats as NA.
AMD_NOT_APPLICABLE = frozenset(
    {float(0xFFFF), float(0x7FFFFFFF), float(0xFFFFFFFF), float(2**32), float(0xFFFFFFFFFFFFFFFF)}
)


def is_amd_not_applicable(raw: float) -> bool:
    return raw in AMD_NOT_APPLICABLE or raw >= float(0xFFFFFFFFFFFFFFFF)


# Huawei Ascend npu-exporter (component/ascend-common/devmanager/common/constants.go: RetError -1,
# UnRetError = uint32 max, FailedValue = int32 max; component/npu-exporter/collector/metrics/
# common_utils.go validateNum, which also catches uint32 max after a float32 round trip).
ASCEND_SENTINELS = frozenset({float(0xFFFFFFFF), float(2**32), float(0x7FFFFFFF)})


__all__ = [
    "AMD_NOT_APPLICABLE",
    "ASCEND_SENTINELS",
    "DCGM_FP64_BLANK",
    "DCGM_INT32_BLANK",
    "DCGM_INT32_MAX",
    "DCGM_INT64_BLANK",
    "is_amd_not_applicable",
    "is_dcgm_blank",
]
