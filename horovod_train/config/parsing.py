"""train's arguments read into a ``RunConfig`` (run_config.py), where the engine rows (engines/specs.py) are read:
the sections (model, data, training, then each row's options), --engine's values and check, train's parser, and an
optional YAML/JSON ``--config`` whose keys are the same names. The flags keep one flat namespace, so a config file
needs no section headers.

Precedence: the fields' defaults < the ``--config`` file < the command line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from transformers.hf_argparser import string_to_bool

from horovod_train.common.errors import UsageError
from horovod_train.config.arguments import (
    ArgumentParser,
    FieldType,
    add_dataclass_arguments,
    field_types,
    given,
    unknown_names_fix,
)
from horovod_train.config.domains import path_problem
from horovod_train.config.run_config import DataArguments, ModelArguments, RunConfig, TrainingArguments
from horovod_train.engines.specs import names, option_sections, spec_of

PACKAGED_CONFIGS = "configs"  # horovod_train/configs/<name>.yaml, found by name after any install


def sections() -> dict[str, type]:
    """The run's sections by name: model, data, training, then each engine's own (the registry as it is now)."""
    return {"model": ModelArguments, "data": DataArguments, "training": TrainingArguments, **option_sections()}


def row_choices() -> dict[str, tuple[str, ...]]:
    """The arguments whose values are the engine rows' (the registry as it is now): --engine's names."""
    return {"engine": tuple(names())}


def run_field_types() -> dict[str, FieldType]:
    """Every argument's type, by its flag name."""
    return {name: kind for cls in sections().values() for name, kind in field_types(cls, row_choices()).items()}


CONFIG_HELP = "YAML or JSON file (or a packaged config name: demo) of the arguments below."


def add_sections(parser: argparse.ArgumentParser) -> None:
    """Each section's arguments, --engine listing the rows' names (the registry as it is now)."""
    for section in sections().values():
        add_dataclass_arguments(parser, section, choices=row_choices())


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """train's arguments on another command's parser (compare, bench train)."""
    parser.add_argument("--config", help=CONFIG_HELP)
    add_sections(parser)


def train_parser(prog: str = "horovod-train train", **kwargs: Any) -> ArgumentParser:
    parser = ArgumentParser(prog=prog, **kwargs)
    add_sections(parser)
    parser.add_argument("--config", help=CONFIG_HELP)
    return parser


def config_path(spec: str) -> Path:
    """A config file by path, else by the name of one shipped in the package (``demo``)."""
    problem = path_problem(spec)
    if problem:
        raise UsageError(f"--config {spec[:60]}... {problem}", "pass a shorter path to --config")
    path = Path(spec)
    if path.is_dir():
        raise UsageError(f"config file {spec} is a directory", "pass a YAML/JSON file (or 'demo') to --config")
    if path.is_file():
        return path
    packaged = resources.files("horovod_train") / PACKAGED_CONFIGS / f"{spec}.yaml"
    if packaged.is_file():
        return Path(str(packaged))
    raise UsageError(f"config file {spec} does not exist", "pass an existing YAML/JSON file (or 'demo') to --config")


def _read_config_text(spec: str, config_file: Path) -> str:
    try:
        return config_file.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"config file {spec} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start})",
            "save it as UTF-8",
        ) from None
    except OSError as exc:
        raise UsageError(f"config file {spec} cannot be read ({exc.strerror})", "pass a readable file") from None


def load_config_file(spec: str) -> dict[str, Any]:
    config_file = config_path(spec)
    text = _read_config_text(spec, config_file)
    try:
        data = json.loads(text) if config_file.suffix == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        first_line = str(exc).splitlines()[0]
        raise UsageError(f"config file {spec} is malformed ({first_line})", "fix its syntax") from None
    data = data or {}
    if not isinstance(data, dict):
        raise UsageError(f"config file {spec} is not a mapping of argument names", "write `name: value` lines")
    odd = [repr(key) for key in data if not isinstance(key, str)]
    if odd:
        raise UsageError(
            f"config file {spec} has key(s) that are not argument names: {', '.join(odd[:5])}",
            "use argument names from `horovod-train train --help` as keys",
        )
    types = run_field_types()
    unknown = sorted(set(data) - set(types))
    if unknown:
        given = [(name, None if data[name] is None else str(data[name])) for name in unknown]
        fix = unknown_names_fix(given, [f"--{name}" for name in types], "horovod-train train")
        raise UsageError(f"unknown key(s) in {spec}: {', '.join(unknown)}", fix)
    return {name: _coerce(name, value, types[name]) for name, value in data.items()}


def _coerce(name: str, value: Any, field_type: FieldType) -> Any:
    """A config file's value as the argument's type: YAML's scalars only (a list, a mapping, or true for a
    number is refused, not turned into text or 1). A Literal's value is checked by its domain."""
    kind, optional = field_type.kind, field_type.optional
    if value is None:
        if optional:
            return None
        raise UsageError(f"{name} must not be null", f"give {name} a value or drop it")
    try:
        if isinstance(value, list | dict | set | tuple) or (isinstance(value, bool) and kind is not bool):
            raise ValueError
        if kind is bool:
            return string_to_bool(value if isinstance(value, bool) else str(value))
        if kind is int and isinstance(value, float) and not value.is_integer():
            raise ValueError
        return kind(value)
    except (TypeError, ValueError, OverflowError, argparse.ArgumentTypeError):
        raise UsageError(
            f"{name}={value!r} is not a valid {kind.__name__}", f"set {name} to a {kind.__name__}"
        ) from None


def parse_run_config(argv: list[str] | None = None, namespace: argparse.Namespace | None = None) -> RunConfig:
    """Defaults < --config file < command line; every section checked as it is built."""
    args = train_parser().parse_args(argv or []) if namespace is None else namespace
    values = load_config_file(args.config) if args.config else {}
    for section in sections().values():
        values.update(given(args, section))
    return run_config_from(values)


def run_config_from(values: dict[str, Any]) -> RunConfig:
    """Each section from the values named by its fields (the others keep their defaults), every row's options
    among them; --engine checked against the rows (spec_of) before the rules between sections."""
    built = {name: section(**{f.name: values[f.name] for f in dataclasses.fields(section) if f.name in values})
             for name, section in sections().items()}  # fmt: skip
    spec_of(built["training"].engine)
    return RunConfig(built.pop("model"), built.pop("data"), built.pop("training"), built)
