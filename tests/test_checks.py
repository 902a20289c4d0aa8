"""refimpl._checks: each helper accepts what its docstring says and raises the documented message.

The layers' error tests (test_attention, test_norms, ...) match fragments of these messages, so a
change of wording here shows up in both places.
"""

import numpy as np
import pytest

from refimpl._checks import (as_float, check_axis, check_bool, check_bool_array, check_choice, check_float_dtype,
                             check_int_array, check_ndim, check_positive_int, check_positive_real, check_real,
                             check_shape, check_type, is_int, is_real)


@pytest.mark.parametrize("value, integer, real", [
    (3, True, True), (np.int64(-2), True, True), (np.uint8(7), True, True),
    (2.5, False, True), (np.float32(1.0), False, True), (float("inf"), False, True),
    (True, False, False), (np.bool_(False), False, False),
    (1 + 2j, False, False), ("3", False, False), (None, False, False), (np.array(3), False, False),
])
def test_is_int_and_is_real(value, integer, real):
    assert is_int(value) is integer
    assert is_real(value) is real


def test_check_positive_int():
    assert check_positive_int(np.int32(4), "n") == 4 and type(check_positive_int(np.int32(4), "n")) is int
    assert check_positive_int(0, "n", allow_zero=True) == 0
    with pytest.raises(TypeError, match=r"^n must be an integer; got bool True$"):
        check_positive_int(True, "n")
    with pytest.raises(TypeError, match=r"^n must be an integer; got float 2.0$"):
        check_positive_int(2.0, "n")
    with pytest.raises(ValueError, match=r"^n must be > 0; got 0$"):
        check_positive_int(0, "n")
    with pytest.raises(ValueError, match=r"^n must be >= 0; got -1$"):
        check_positive_int(-1, "n", allow_zero=True)


def test_check_real():
    assert check_real(np.float32(0.5), "s") == np.float32(0.5)
    assert check_real(float("nan"), "s") != check_real(float("nan"), "s")  # returned unchanged; no finiteness asked
    with pytest.raises(TypeError, match=r"^s must be a real number; got str '1'$"):
        check_real("1", "s")
    with pytest.raises(TypeError, match=r"^s must be a real number or None; got bool False$"):
        check_real(False, "s", what="a real number or None")
    with pytest.raises(ValueError, match=r"^s must be finite \(why\); got inf$"):
        check_real(float("inf"), "s", finite=" (why)")
    with pytest.raises(ValueError, match=r"^s must be finite; got nan$"):
        check_real(float("nan"), "s", finite="")


def test_check_positive_real():
    assert check_positive_real(np.int64(3), "eps") == 3.0 and type(check_positive_real(np.int64(3), "eps")) is float
    assert check_positive_real(0.0, "eps", allow_zero=True) == 0.0
    with pytest.raises(ValueError, match=r"^eps must be finite and > 0; got 0$"):
        check_positive_real(0, "eps")
    with pytest.raises(ValueError, match=r"^eps must be finite and >= 0; got -1e-05$"):
        check_positive_real(-1e-5, "eps", allow_zero=True)
    with pytest.raises(ValueError, match=r"^eps must be finite and >= 0; got inf$"):
        check_positive_real(float("inf"), "eps", allow_zero=True)
    with pytest.raises(TypeError, match=r"^eps must be a real number; got NoneType None$"):
        check_positive_real(None, "eps")


def test_check_float_dtype():
    assert check_float_dtype("float32", "dtype") == np.float32
    with pytest.raises(TypeError, match=r"^dtype must be a floating-point dtype; got 'nonsense'$"):
        check_float_dtype("nonsense", "dtype")
    with pytest.raises(TypeError, match=r"^dtype must be a floating-point dtype \(float16/32/64\); got int64$"):
        check_float_dtype(np.int64, "dtype")


def test_check_ndim_and_shape_and_axis():
    x = np.zeros((2, 3))
    check_ndim(x, "x", 2, "[T, D]")
    check_ndim(x, "x", 2, "[T, D]", exact=True)
    with pytest.raises(ValueError, match=r"^x must have shape \[\.\.\., T, D\] \(at least 3 dimensions\); got shape "
                                         r"\(2, 3\)$"):
        check_ndim(x, "x", 3, "[..., T, D]")
    with pytest.raises(ValueError, match=r"^x must have shape \[D\]; got shape \(2, 3\)$"):
        check_ndim(x, "x", 1, "[D]", exact=True)
    check_shape(x, "x", (2, 3), "[2, 3]")
    with pytest.raises(ValueError, match=r"^b must have shape \[C\] with C=4; got shape \(2, 3\)$"):
        check_shape(x, "b", (4,), "[C] with C=4")
    check_axis(x, "x", -1, 3, "[..., in]", "in")
    with pytest.raises(ValueError, match=r"^x must have shape \[\.\.\., in\] with in=4; got shape \(2, 3\)$"):
        check_axis(x, "x", -1, 4, "[..., in]", "in")


def test_check_int_array():
    assert check_int_array([1, 2], "L").dtype.kind == "i"
    assert check_int_array([0.5], "p", floats_ok=True).dtype.kind == "f"
    with pytest.raises(TypeError, match=r"^L must hold integers; got dtype bool$"):
        check_int_array([True], "L")
    with pytest.raises(TypeError, match=r"^L must be integers of shape \[B\]; got dtype float64$"):
        check_int_array([1.0], "L", what="be integers of shape [B]")
    with pytest.raises(TypeError, match=r"^p must be integers or floats; got dtype complex128$"):
        check_int_array([1j], "p", what="be integers or floats", floats_ok=True)


def test_check_bool_array_and_check_bool():
    assert check_bool_array([True], "m").dtype == np.bool_
    with pytest.raises(TypeError, match=r"^m must be boolean; got dtype int64$"):
        check_bool_array(np.array([1], dtype=np.int64), "m")
    with pytest.raises(TypeError, match=r"^mask must be boolean \(True = may attend\); got dtype float64\. Pass it$"):
        check_bool_array([1.0], "mask", what="boolean (True = may attend)", hint=". Pass it")
    assert check_bool(np.bool_(True), "causal") is True
    with pytest.raises(TypeError, match=r"^causal must be True or False; got str 'yes'$"):
        check_bool("yes", "causal")
    with pytest.raises(TypeError, match=r"^causal must be True or False; got int 1$"):
        check_bool(1, "causal")


def test_check_type_and_check_choice():
    assert check_type(3, int, "n") == 3
    with pytest.raises(TypeError, match=r"^p must be int; got str$"):
        check_type("a", int, "p")
    with pytest.raises(TypeError, match=r"^p must be a LinearParams; got dict$"):
        check_type({}, int, "p", what="a LinearParams")
    check_choice("left", "side", ("right", "left"))
    with pytest.raises(ValueError, match=r"^side must be 'right' or 'left'; got 'up'$"):
        check_choice("up", "side", ("right", "left"))
    with pytest.raises(ValueError, match=r"^part must be 'both', 'local' or 'strided'; got None$"):
        check_choice(None, "part", ("both", "local", "strided"))
    with pytest.raises(ValueError, match=r"^mode must be 'only'; got 1$"):
        check_choice(1, "mode", ("only",))


def test_as_float():
    assert as_float(np.zeros(2, np.float16), "x").dtype == np.float16
    assert as_float([1, 2], "x").dtype == np.float64
    with pytest.raises(TypeError, match=r"^x must be a real floating-point array; got dtype complex128$"):
        as_float([1j], "x")


def test_memory_limit_is_the_smaller_of_physical_memory_and_a_cgroup_limit(tmp_path):
    """memory_limit: the machine's memory, or a lower cgroup v2 / v1 limit; "max", v1's huge "no limit" value, a
    missing or unreadable file give no limit of their own."""
    import os

    from refimpl._checks import memory_limit

    physical = int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    v2, v1, none, huge = (tmp_path / n for n in ("memory.max", "memory.limit_in_bytes", "none", "huge"))
    v2.write_text("1073741824\n")
    v1.write_text("2147483648\n")
    none.write_text("max\n")
    huge.write_text(f"{(1 << 63) - 4096}\n")
    assert memory_limit(()) == physical
    assert memory_limit((v2, v1)) == min(physical, 1 << 30)
    assert memory_limit((v1,)) == min(physical, 2 << 30)
    assert memory_limit((none, huge, tmp_path / "missing", tmp_path)) == physical
