"""The configs check every option's type before its range, in one place
(:func:`packtool.config.option_value`, driven by each field's annotation): a value of the wrong
type is one ConfigError naming the option, what it got and what it takes, never a value cut to
an integer, a raw Python error or a crash when the manifest is written."""

from __future__ import annotations

import dataclasses
import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from packtool.config import CompareConfig, PackConfig, TokenizeConfig
from packtool.errors import ConfigError

#: The fields each config needs, with valid values.
REQUIRED = {PackConfig: dict(inputs=("x",), output="y"),
            CompareConfig: dict(inputs=("x",), capacity=8),
            TokenizeConfig: dict(inputs=("x",), output="y", tokenizer="t")}

ENUMS = {"Strategy", "Overflow", "LabelMode", "Engine"}


def wrong_values(annotation: str) -> list:
    """Values of the wrong type for a field of this annotation (None unless it is optional)."""
    kind = annotation.replace(" ", "")
    optional = kind.endswith("|None")
    kind = kind.removesuffix("|None")
    values = [] if optional else [None]
    if kind == "int":  # a float is refused even when integral: 8.0 is not silently 8
        values += ["8", 1.5, 8.0, True, False, np.float64(8), np.bool_(True), [8], Fraction(8)]
    elif kind == "int|str":
        values += [1.5, True, b"x", [8]]
    elif kind == "float":
        values += ["0.5", True, np.bool_(True), [0.5], b"x"]
    elif kind == "bool":
        values += ["no", "", 0, 1, np.int64(1), 0.0]
    elif kind == "str":
        values += [5, 1.5, b"x", ["a"], True]
    elif kind == "tuple[str,...]":
        values += ["x", 5, [5], [b"x"], [None]]
    else:
        assert kind in ENUMS, f"no wrong values for the annotation {annotation!r}"
        values += [5, "nope", ["obfd"], True]
    return values


FIELDS = [(cls, f) for cls in REQUIRED for f in dataclasses.fields(cls)]


@pytest.mark.parametrize("cls, field", FIELDS, ids=[f"{c.__name__}.{f.name}" for c, f in FIELDS])
def test_every_option_of_the_wrong_type_is_one_config_error_naming_it(cls, field):
    """Every field of every config, every kind of wrong value: ``--NAME VALUE: must be WHAT,
    not TYPE`` (the choices: ``choose one of``; a list names its bad item), raised before any
    range check could misname it (capacity=3.7 used to be blamed on --segment-multiple)."""
    for value in wrong_values(field.type):
        with pytest.raises(ConfigError) as exc:
            cls(**{**REQUIRED[cls], field.name: value})
        msg = str(exc.value)
        got = value[0] if field.type.startswith("tuple") and isinstance(value, list) else value
        assert msg.startswith(f"--{field.name.replace('_', '-')} {got!r}: "), msg
        if field.type in ENUMS:
            assert "choose one of" in msg
        else:
            assert "must be " in msg and msg.endswith(f", not {type(got).__name__}"), msg


def test_numpy_scalars_and_paths_are_taken_as_the_equal_plain_values():
    """np.int64(8) is 8, np.float32(0.3) is 0.3, np.bool_ is bool, a Path is its str: the config
    holds only plain values, so its manifest record is the Python-int one (it used to crash:
    Object of type int64 is not JSON serializable)."""
    plain = dict(capacity=8, segment_multiple=2, pad_id=3, append_eos=2, prepend_bos=1,
                 seed=4, rows_per_shard=5, rows_per_group=6, workers=1, window_docs=7,
                 min_fill=0.3, row_group_mb=0.5, holdout=0.25, shuffle=False, overwrite=True,
                 skip_unsupported=True)
    numpy = {k: (np.bool_(v) if isinstance(v, bool) else np.float32(v) if isinstance(v, float)
                 else np.int64(v) if k != "pad_id" else np.int32(v)) for k, v in plain.items()}
    want = PackConfig(inputs=("in",), output="out", **plain)
    got = PackConfig(inputs=[Path("in")], output=Path("out"), **numpy)
    assert json.dumps(got.to_dict()) == json.dumps(want.to_dict())
    for f in dataclasses.fields(PackConfig):
        a, b = getattr(got, f.name), getattr(want, f.name)
        assert type(a) is type(b) and a == b, f.name
    tok = TokenizeConfig(inputs=[Path("a")], output=Path("b"), tokenizer=Path("t"),
                         append_eos=np.int64(2), prepend_bos="<s>", batch_docs=np.uint16(9))
    assert (tok.inputs, tok.output, tok.tokenizer) == (("a",), "b", "t")
    assert type(tok.append_eos) is int and type(tok.batch_docs) is int
    assert type(CompareConfig(inputs=["x"], capacity=np.int16(8)).capacity) is int


def test_option_value_refuses_an_annotation_it_has_no_check_for():
    """A new config field of a type the check does not know fails loudly, not unchecked."""
    from packtool.config import option_value

    with pytest.raises(TypeError, match="no check"):
        option_value("x", 1, "list[int]")
    assert option_value("batch_rows", np.int64(3), "int", minimum=1) == 3
    with pytest.raises(ConfigError, match=r"^--batch-rows 0: must be >= 1$"):
        option_value("batch_rows", 0, "int", minimum=1)
