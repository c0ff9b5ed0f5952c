"""CPU tier: every config class holds every field to its declared type and range when constructed
(runtime.config_fields), and everything the library itself builds -- defaults, sweep candidates, tuned-table
entries -- still constructs, from its plain JSON fields too."""

from __future__ import annotations

import dataclasses
import json
import typing

import numpy as np
import pytest

from cute_kernels import registry, tuned
from cute_kernels.ops.attention.flash2_mma import FlashConfig
from cute_kernels.ops.attention.flash2_tf32x3 import Tf32x3Config
from cute_kernels.ops.attention.flash3_wgmma import Flash3Config
from cute_kernels.ops.gemm import Sm90Tf32x3Config, Tf32x3GemmConfig
from cute_kernels.ops.attention.fused_fp32 import Fp32Config
from cute_kernels.ops.conv3d.config import Conv3dConfig, grid_shape
from cute_kernels.ops.conv3d.direct import Conv3dArgs
from cute_kernels.ops.conv3d.problem import Conv3dProblem
from cute_kernels.ops.gemm.gemv import GemvConfig
from cute_kernels.ops.gemm.hgemm_sm80_config import HgemmConfig
from cute_kernels.ops.gemm.hgemm_sm90_config import HgemmSm90Config
from cute_kernels.ops.gemm.sgemm_config import GemmConfig
from cute_kernels.ops.conv3d.tiled import TiledConvConfig
from cute_kernels.ops.scan.config import ColumnScanConfig, ScanConfig
from cute_kernels.runtime.checks import INT32_MAX
from cute_kernels.runtime.config_fields import ConfigFieldTypeError, check_fields

CONFIG_CLASSES = (GemmConfig, GemvConfig, HgemmConfig, HgemmSm90Config, Sm90Tf32x3Config, Tf32x3GemmConfig, Fp32Config,
                  FlashConfig, Flash3Config, Tf32x3Config, Conv3dConfig, ScanConfig, ColumnScanConfig, TiledConvConfig)


def _fields_of(kind: type) -> list[tuple[type, str]]:
    return [(cls, f.name) for cls in CONFIG_CLASSES for f in dataclasses.fields(cls)
            if typing.get_type_hints(cls)[f.name] is kind]


INT_FIELDS = _fields_of(int)
BOOL_FIELDS = _fields_of(bool)
STR_FIELDS = _fields_of(str)


def _ids(cases):
    return [f"{cls.__name__}.{name}" for cls, name in cases]


def _replace(cls, name, value):
    return dataclasses.replace(cls(), **{name: value})


def test_every_registered_config_class_is_covered_here():
    # A new registry entry with a new config class must join CONFIG_CLASSES (and so every test below).
    assert {spec.config_cls for spec in registry.list()} <= set(CONFIG_CLASSES)
    # Every field of every config is one of the kinds tested below.
    assert len(INT_FIELDS) + len(BOOL_FIELDS) + len(STR_FIELDS) == sum(len(dataclasses.fields(c)) for c in CONFIG_CLASSES)
    assert ("Conv3dConfig", "depth") in [(c.__name__, n) for c, n in INT_FIELDS]


# ------------------------------------------------------------------------------------------------- types
# 256.0 and True pass a membership test (256.0 == 256, True == 1) and reached NVRTC as "256.0" / "True";
# numpy integers are refused rather than converted (config_fields' docstring says why).
WRONG_FOR_INT = [True, False, 8.0, 128.7, float("nan"), "8", None, np.int64(8), np.int32(128), 8 + 0j, [8], (8,)]


@pytest.mark.parametrize("cls, name", INT_FIELDS, ids=_ids(INT_FIELDS))
@pytest.mark.parametrize("value", WRONG_FOR_INT, ids=repr)
def test_int_fields_take_only_an_int(cls, name, value):
    with pytest.raises(TypeError, match=rf"^{cls.__name__}\.{name}: expected an int, got .*{type(value).__name__}\)$"):
        _replace(cls, name, value)


@pytest.mark.parametrize("cls, name", INT_FIELDS, ids=_ids(INT_FIELDS))
def test_a_float_equal_to_the_default_is_refused_too(cls, name):
    default = getattr(cls(), name)
    with pytest.raises(TypeError, match=rf"{cls.__name__}\.{name}: expected an int, got {float(default)!r} \(float\)"):
        _replace(cls, name, float(default))
    with pytest.raises(TypeError, match=rf"{cls.__name__}\.{name}: expected an int, got .*numpy.int64"):
        _replace(cls, name, np.int64(default))
    assert getattr(_replace(cls, name, int(default)), name) == default


WRONG_FOR_BOOL = [1, 0, "yes", "False", "true", None, np.bool_(True), 1.0]


@pytest.mark.parametrize("cls, name", BOOL_FIELDS, ids=_ids(BOOL_FIELDS))
@pytest.mark.parametrize("value", WRONG_FOR_BOOL, ids=repr)
def test_bool_fields_take_only_a_bool(cls, name, value):
    # "staged": "yes" read as truthy staged a tile the caller wanted in registers (and "False" as True).
    with pytest.raises(TypeError, match=rf"^{cls.__name__}\.{name}: expected a bool, got "):
        _replace(cls, name, value)


WRONG_FOR_STR = [1, None, b"m", ["m"], True, np.str_("m")]


@pytest.mark.parametrize("cls, name", STR_FIELDS, ids=_ids(STR_FIELDS))
@pytest.mark.parametrize("value", WRONG_FOR_STR, ids=repr)
def test_str_fields_take_only_a_str(cls, name, value):
    with pytest.raises(TypeError, match=rf"^{cls.__name__}\.{name}: expected a str, got "):
        _replace(cls, name, value)


def test_a_wrong_type_is_also_the_value_error_callers_catch():
    # Configs refused wrong types with ValueError before; callers that skip invalid configs still catch it.
    with pytest.raises(ValueError, match="ScanConfig.threads"):
        ScanConfig(threads=256.0)
    assert issubclass(ConfigFieldTypeError, TypeError) and issubclass(ConfigFieldTypeError, ValueError)


def test_positional_construction_is_checked_as_keywords_are():
    with pytest.raises(TypeError, match="Conv3dConfig.thread_h: expected an int, got True"):
        Conv3dConfig(16, 64, True, 4, 32, 2)  # True == 1 is a valid thread_h by value
    with pytest.raises(TypeError, match="Fp32Config.block_m: expected an int, got 128.0"):
        Fp32Config(128.0, 64, 4)
    with pytest.raises(TypeError, match="ScanConfig.staged: expected a bool, got 'no'"):
        ScanConfig(256, 32, "no")


# ------------------------------------------------------------------------------------------------ ranges
@pytest.mark.parametrize("cls, name", INT_FIELDS, ids=_ids(INT_FIELDS))
@pytest.mark.parametrize("value", [-1, -(2**31), 2**31, 2**32 + 8, 2**63, 2**64 + 128, 10**30])
def test_int_fields_are_bounded_on_both_sides(cls, name, value):
    # No integer field of any config accepts a negative value or one past the int32 kernel arguments.
    with pytest.raises(ValueError, match=rf"^{cls.__name__}\.{name}: expected ") as caught:
        _replace(cls, name, value)
    assert not isinstance(caught.value, TypeError)


def test_conv3d_depth_must_fit_the_kernels_int32_argument():
    # The premise: the kernel's chunk_depth is a ctypes int32 that wraps silently past 2^31 - 1.
    assert Conv3dArgs(chunk_depth=2**31).chunk_depth == -(2**31)
    for depth in (2**31, 2**32 + 32, 2**40):
        with pytest.raises(ValueError, match=rf"Conv3dConfig.depth: expected 1 to {INT32_MAX} .*got {depth}"):
            Conv3dConfig(depth=depth)
    for depth in (0, -1):
        with pytest.raises(ValueError, match="Conv3dConfig.depth"):
            Conv3dConfig(depth=depth)
    config = Conv3dConfig(depth=INT32_MAX)
    assert Conv3dArgs(chunk_depth=config.depth).chunk_depth == INT32_MAX
    assert grid_shape(config, Conv3dProblem(1, 40, 40, 40, 3, 3, 3))[2] == 1


@pytest.mark.parametrize("cls, name, value", [
    (GemmConfig, "min_ctas_per_sm", 5), (GemmConfig, "raster", 65), (GemmConfig, "warp_rows", 16),
    (HgemmConfig, "raster", 0), (HgemmConfig, "num_stages", 9), (HgemmSm90Config, "raster", 65),
    (Fp32Config, "block_n", 128), (FlashConfig, "block_n", 256), (FlashConfig, "mainloop", "Lean"),
    (Tf32x3Config, "block_m", 32), (Tf32x3Config, "block_n", 128),
    (Conv3dConfig, "stages", 5), (Conv3dConfig, "tile_w", 8192 + 64), (Conv3dConfig, "tile_h", 4096),
    (ScanConfig, "ramp_ns", 100_001), (ScanConfig, "items_per_thread", 128), (ScanConfig, "lookback", ""),
], ids=lambda v: v.__name__ if isinstance(v, type) else repr(v))
def test_out_of_range_values_name_the_field(cls, name, value):
    with pytest.raises(ValueError, match=rf"^{cls.__name__}\.{name}: expected .*got {value!r}"):
        _replace(cls, name, value)


def test_conv3d_tile_bounds_refuse_nothing_the_thread_limit_accepts():
    # tile_w <= 1024 * thread_w and tile_h <= 128 * thread_h are implied by <= 1024 threads of >= 8 per row:
    # the largest tiles that ever were valid still are.
    assert Conv3dConfig(tile_h=1, tile_w=1024 * 4, thread_h=1, thread_w=4).threads == 1024
    assert Conv3dConfig(tile_h=128 * 4, tile_w=32, thread_h=4, thread_w=4).threads == 1024
    with pytest.raises(ValueError, match="Conv3dConfig.tile_h: expected a positive multiple of thread_h = 4 up to"):
        Conv3dConfig(tile_h=129 * 4, tile_w=32, thread_h=4, thread_w=4)


# ----------------------------------------------------------------- what the library builds still constructs
def _roundtrip(config):
    """The config rebuilt from its JSON fields with no coercion: what a strict tuned-table reader does."""
    fields = json.loads(json.dumps(dataclasses.asdict(config)))
    return type(config)(**fields)


@pytest.mark.parametrize("spec", registry.list(), ids=lambda s: f"{s.op}/{s.variant}")
def test_every_candidate_and_default_constructs_and_roundtrips(spec):
    candidates = list(spec.candidates())
    assert candidates
    for config in candidates:
        assert type(config) is spec.config_cls
        assert _roundtrip(config) == config
        hash(config)
    for problem in spec.standard_problems():
        config = spec.default_config(problem)
        assert type(config) is spec.config_cls
        assert _roundtrip(config) == config


@pytest.mark.parametrize("spec", [s for s in registry.list() if tuned.path_for(s).is_file()],
                         ids=lambda s: f"{s.op}/{s.variant}")
def test_every_tuned_entry_constructs_from_its_fields_as_they_are(spec):
    data = json.loads(tuned.path_for(spec).read_text())
    assert data["entries"]
    for entry in data["entries"]:
        strict = spec.config_cls(**entry["config"])  # no conversion: the JSON holds the declared types
        assert strict == tuned.config_from_fields(spec.config_cls, entry["config"])
        # Fields newer than an entry take their defaults (HgemmConfig.swizzle); the others are as written.
        assert {name: getattr(strict, name) for name in entry["config"]} == entry["config"]


@pytest.mark.parametrize("fields, fragment", [
    ({"staged": "yes"}, "ScanConfig.staged: expected a bool, got 'yes'"),
    ({"staged": 0}, "ScanConfig.staged: expected a bool, got 0"),
    ({"threads": 256.7}, "ScanConfig.threads: expected an int, got 256.7"),
    ({"threads": 256.0}, "ScanConfig.threads: expected an int, got 256.0"),
    ({"threads": "256"}, "ScanConfig.threads: expected an int, got '256'"),
    ({"ramp_ns": None}, "ScanConfig.ramp_ns: expected an int, got None"),
    ({"lookback": 1}, "ScanConfig.lookback: expected a str, got 1"),
])
def test_json_values_that_a_tuned_file_could_get_wrong_are_refused(fields, fragment):
    decoded = json.loads(json.dumps(fields))
    with pytest.raises(TypeError, match=fragment.replace(".", r"\.")):
        ScanConfig(**decoded)


# ---------------------------------------------------------------------------------------- the helper itself
@dataclasses.dataclass(frozen=True)
class _Shapes:
    tiles: tuple[int, ...] = (1, 2)
    pair: tuple[int, str] = (1, "a")
    scale: float = 1.0
    name: str = "x"

    def __post_init__(self):
        check_fields(self)


def test_helper_checks_tuple_and_float_annotations():
    assert _Shapes(tiles=(), scale=2) == _Shapes(tiles=(), scale=2)
    for kwargs, fragment in [({"tiles": [1, 2]}, "_Shapes.tiles: expected a tuple, each item an int"),
                             ({"tiles": (1, True)}, "_Shapes.tiles: expected a tuple, each item an int"),
                             ({"pair": (1, 2)}, r"_Shapes.pair: expected a tuple of 2 \(an int, a str\)"),
                             ({"pair": (1,)}, r"_Shapes.pair: expected a tuple of 2"),
                             ({"scale": True}, "_Shapes.scale: expected a finite float"),
                             ({"scale": float("inf")}, "_Shapes.scale: expected a finite float"),
                             ({"scale": "1"}, "_Shapes.scale: expected a finite float")]:
        with pytest.raises(TypeError, match=fragment):
            _Shapes(**kwargs)


def test_helper_refuses_an_annotation_it_has_no_rule_for():
    @dataclasses.dataclass(frozen=True)
    class Odd:
        values: list = dataclasses.field(default_factory=list)

        def __post_init__(self):
            check_fields(self)

    with pytest.raises(TypeError, match="Odd: config_fields has no type rule for the annotation"):
        Odd()
