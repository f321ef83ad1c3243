"""Command-line arguments from dataclasses, by transformers' ``HfArgumentParser``, in the project's style.

HfArgumentParser makes each field an argument from its type hint: ``X | None`` takes an X, a ``Literal``
one of its values, a ``bool`` is ``--flag [BOOL]`` and, when it defaults to true, also ``--no_flag``; a
dataclass's ``_argument_group_name`` is its section of ``--help``. On top of that (``_adjusted``):

- every argument's default is None, so a namespace tells what the command line gave: a config file's
  value must survive a flag that was left out (``given``). ``--name None`` on an optional argument is
  ``EXPLICIT_NONE``, which does override a config file;
- a ``Literal``'s values are listed in ``--help`` and checked by the field's domain (domains.py), which
  refuses a command-line value and a config file's in the same words;
- an error is one line (``UsageError``, exit 2), not argparse's usage dump; an unknown flag's names the
  help of the (sub)command it was given to, and what to pass instead (``unknown_arguments_fix``);
- a help text that says its own default (``default: ...``) gets no second one.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import difflib
import re
from collections.abc import Iterable
from types import NoneType
from typing import Any, Literal, get_args, get_origin, get_type_hints

from transformers import HfArgumentParser

from horovod_train.common.errors import UsageError
from horovod_train.engines.specs import ENGINES

TRUE_VALUES, FALSE_VALUES = ("yes", "true", "t", "y", "1"), ("no", "false", "f", "n", "0")  # string_to_bool's


# A help text that describes its default itself ("(default: the task's)"), where the field's value would mislead.
SAYS_ITS_DEFAULT = re.compile(r"\(default: ")


class _ExplicitNone:
    """`--flag None` on the command line: unlike an absent flag (None), it overrides a config file."""

    def __repr__(self) -> str:
        return "None"


EXPLICIT_NONE = _ExplicitNone()


@dataclasses.dataclass(frozen=True)
class FieldType:
    """What a field's type hint takes: ``kind`` (str, int, float, bool or list; a Literal's values' type),
    whether None is allowed, and a Literal's values."""

    kind: type
    optional: bool = False
    choices: tuple[Any, ...] | None = None

    @classmethod
    def of(cls, hint: Any) -> FieldType:
        optional = type(None) in get_args(hint)
        if optional:
            hint = next(arg for arg in get_args(hint) if arg is not NoneType)
        if get_origin(hint) is Literal:
            choices = get_args(hint)
            return cls(type(choices[0]), optional, choices)
        return cls(get_origin(hint) or hint, optional)


def field_types(dtype: type, choices: dict[str, tuple[str, ...]] | None = None) -> dict[str, FieldType]:
    """Each field's type; ``choices``: the values of a text field whose values are a registry's, read by the caller
    (--engine's: config/parsing.py), as a Literal's are."""
    hints, choices = get_type_hints(dtype), choices or {}
    types = {f.name: FieldType.of(hints[f.name]) for f in dataclasses.fields(dtype) if f.init}
    return {name: dataclasses.replace(kind, choices=choices[name]) if name in choices else kind
            for name, kind in types.items()}  # fmt: skip


def field_default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _optional(kind: Any) -> Any:
    def parse(value: str) -> Any:
        return EXPLICIT_NONE if value.lower() in ("none", "null") else kind(value)

    parse.__name__ = getattr(kind, "__name__", "value")  # argparse's "invalid int value: ..."
    return parse


def _adjusted(f: dataclasses.Field, field_type: FieldType, kwargs: dict[str, Any], shown_default: Any) -> dict:
    """HfArgumentParser's keywords for ``f``'s argument, in our conventions (see the module's doc)."""
    kwargs = dict(kwargs, default=None)
    kwargs.pop("domain", None)  # the field's check (domains.py), not argparse's
    if kwargs.get("action") == "store_false":  # HfArgumentParser's --no_<flag>
        return {**kwargs, "help": f"The same as --{f.name} false. (default: not given)"}
    if field_type.choices is not None:
        kwargs.pop("choices", None)  # a Literal's; a registry's come from add_dataclass_arguments' choices
        kwargs["metavar"] = "{" + ",".join(map(str, field_type.choices)) + "}"
    elif field_type.kind is bool:  # also an optional bool: a bare --flag is true
        kwargs.update(nargs="?", const=True, metavar="BOOL")
    elif field_type.optional:
        kwargs["type"] = _optional(kwargs["type"])
    kinds = {str: "STR", int: "INT", float: "FLOAT"}
    if field_type.kind in kinds and "choices" not in kwargs:
        kwargs.setdefault("metavar", kinds[field_type.kind])
    help_text = kwargs.get("help") or ""
    if not SAYS_ITS_DEFAULT.search(help_text):
        help_text = f"{help_text} (default: {shown_default})".strip()
    kwargs["help"] = help_text.replace("%", "%%")
    return kwargs


class _Adjusting:
    """The parser or group HfArgumentParser adds one field's argument(s) to, adjusting them."""

    def __init__(self, target: Any, f: dataclasses.Field, field_type: FieldType, shown_default: Any) -> None:
        self.target, self.field, self.field_type, self.shown_default = target, f, field_type, shown_default

    def add_argument(self, *names: str, **kwargs: Any) -> argparse.Action:
        return self.target.add_argument(*names, **_adjusted(self.field, self.field_type, kwargs, self.shown_default))


def add_dataclass_arguments(
    parser: argparse.ArgumentParser,
    dtype: type,
    only: Iterable[str] | None = None,
    shown: dict[str, str] | None = None,
    choices: dict[str, tuple[str, ...]] | None = None,
) -> None:
    """``dtype``'s fields (or those named in ``only``) as arguments of any argparse parser, the way
    HfArgumentParser makes them (its own ``_add_dataclass_arguments`` needs an HfArgumentParser).
    ``shown``: the default --help gives, where a command fills in its own (bench gpu's sizes). ``choices``: the
    values --help lists for a text field whose values are a registry's (field_types); its domain is checked where
    the registry is read too."""
    title = getattr(dtype, "_argument_group_name", None)
    target = parser.add_argument_group(title) if title else parser
    types, hints = field_types(dtype, choices), get_type_hints(dtype)
    wanted = set(only) if only is not None else None
    for f in dataclasses.fields(dtype):
        if f.init and (wanted is None or f.name in wanted):
            resolved = copy.copy(f)  # HfArgumentParser rewrites .type; the class's own field keeps its hint
            resolved.type = hints[f.name]
            shown_default = (shown or {}).get(f.name, field_default(f))
            HfArgumentParser._parse_dataclass_field(_Adjusting(target, f, types[f.name], shown_default), resolved)


class ArgumentParser(HfArgumentParser):
    """HfArgumentParser with the adjustments above, argparse's plain help layout (each help says its
    default) and the project's error style."""

    def __init__(self, dataclass_types: Any = None, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.HelpFormatter)
        # No prefixes: Trainer's --fsdp must not be taken for --fsdp_reshard_after_forward (nor refused as ambiguous)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(list(dataclass_types or []), **kwargs)

    def _add_dataclass_arguments(self, dtype: type) -> None:
        add_dataclass_arguments(self, dtype)

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message, f"see `{self.prog} --help`")

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        """argparse's, but the flags no parser knew are refused by the (sub)command they were given to."""
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            command = chosen_command(self, parsed)
            raise UsageError(f"unrecognized arguments: {' '.join(unknown)}", unknown_arguments_fix(unknown, command))
        return parsed


def chosen_command(parser: argparse.ArgumentParser, parsed: argparse.Namespace) -> argparse.ArgumentParser:
    """The innermost subcommand's parser that ``parsed`` went through (``parser`` itself if it has none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and getattr(parsed, action.dest, None) in action.choices:
            return chosen_command(action.choices[getattr(parsed, action.dest)], parsed)
    return parser


# The names users bring from transformers' Trainer, accelerate and torch.distributed.launch that this project
# spells otherwise or does not take: name -> {the value given (None: any other) -> what to do here}.
FOREIGN_NAMES: dict[str, dict[str | None, str]] = {
    "mixed_precision": {
        "bf16": "did you mean --bf16?",
        "fp16": "did you mean --fp16?",
        "no": "drop it: fp32 is the default.",
        None: "this project has --bf16 and --fp16 (fp32 is the default).",
    },
    "fp32": {None: "drop it: fp32 is the default (--bf16 or --fp16 for mixed precision)."},
    "evaluation_strategy": {None: "did you mean --eval_strategy?"},
    "logging_dir": {None: "did you mean --report_to tensorboard? Its event files go to <output_dir>/runs/<run_name>."},
    "logging_strategy": {None: "did you mean --logging_steps N? This project logs every N steps."},
    "per_gpu_train_batch_size": {None: "did you mean --per_device_train_batch_size?"},
    "per_gpu_eval_batch_size": {None: "did you mean --per_device_eval_batch_size?"},
    "num_processes": {None: "give the launcher the process count (horovodrun -np N, torchrun --nproc_per_node N)."},
    "local_rank": {None: "drop it: torchrun, horovodrun and mpirun give each rank its local rank."},
    "no_cuda": {None: "did you mean --use_cpu? (transformers' name since 4.35)"},
    "eval_accumulation_steps": {
        None: "drop it: evaluation moves each batch's outputs to the CPU as it goes, so "
        "accelerator memory does not grow with the validation set."
    },
    "push_to_hub": {
        None: "not supported (compute nodes often have no network): upload --output_dir after the run "
        "with `hf upload <repo> <output_dir>`; it holds the model, tokenizer and model card (README.md)."
    },
    "use_fast_tokenizer": {None: "drop it: the tokenizer is always the fast one."},
    "data_seed": {None: "drop it: --seed orders the data too (one seed for the model and the data)."},
}
FOREIGN_NAMES.update({name: FOREIGN_NAMES["push_to_hub"] for name in ("hub_model_id", "hub_token", "hub_strategy",
                                                                      "hub_private_repo")})  # fmt: skip


def foreign_names() -> dict[str, dict[str | None, str]]:
    """FOREIGN_NAMES and the names that mean an engine (--fsdp, --deepspeed), each from its row
    (EngineSpec.foreign_flags; the rows as they are now)."""
    rows = {name: {None: hint} for spec in ENGINES.values() for name, hint in spec.foreign_flags.items()}
    return FOREIGN_NAMES | rows


def trainer_argument(name: str) -> str | None:
    """A line for a transformers TrainingArguments field this project does not take, else None."""
    from transformers import TrainingArguments  # only on this error path: it is slow to import

    if name in {f.name for f in dataclasses.fields(TrainingArguments)}:
        return f"transformers' Trainer takes --{name}; this project has no such option."
    return None


def flags_and_values(unknown: list[str]) -> list[tuple[str, str | None]]:
    """(flag, its value or None) for each flag among argparse's unrecognized arguments, in their order."""
    found: list[tuple[str, str | None]] = []
    for token in unknown:
        if token.startswith("-"):
            flag, _, value = token.partition("=")
            found.append((flag, value or None))
        elif found and found[-1][1] is None:
            found[-1] = (found[-1][0], token)
    return found


def unknown_name_hint(flag: str, value: str | None, known: Iterable[str]) -> str | None:
    """What to pass instead of ``flag``: the table's entry for its name, else the closest known flag."""
    name = flag.lstrip("-").replace("-", "_")
    foreign = foreign_names()
    if name in foreign:
        return foreign[name].get(value or "", foreign[name][None])
    refused = trainer_argument(name)  # before a close name: --logging_first_step is not --logging_steps
    close = difflib.get_close_matches(f"--{name}", list(known), n=1, cutoff=0.75)
    return refused or (f"did you mean {close[0]}?" if close else None)


def option_names(parser: argparse.ArgumentParser) -> list[str]:
    """The parser's long options as --help shows them (HfArgumentParser's dashed aliases left out)."""
    return [name for name in parser._option_string_actions if name.startswith("--") and "-" not in name[2:]]


def unknown_arguments_fix(unknown: list[str], parser: argparse.ArgumentParser) -> str:
    return unknown_names_fix(flags_and_values(unknown), option_names(parser), parser.prog)


def unknown_names_fix(given: list[tuple[str, str | None]], known: list[str], command: str) -> str:
    """``for --mixed_precision, did you mean --bf16? See `horovod-train train --help```: a sentence per name
    (a flag, or a config file's key, with its value) that has a hint, then the command's help."""
    sentences = []
    for name, value in given:
        hint = unknown_name_hint(name, value, known)
        if hint:
            sentences.append(f"for {name}, {hint}")
    sentences.append(f"see `{command} --help`")
    return " ".join([sentences[0], *(s[0].upper() + s[1:] for s in sentences[1:])])


def given(namespace: argparse.Namespace, dtype: type) -> dict[str, Any]:
    """The values of ``dtype``'s fields that the command line gave (None for an explicit None)."""
    values = {f.name: getattr(namespace, f.name, None) for f in dataclasses.fields(dtype)}
    return {name: None if value is EXPLICIT_NONE else value for name, value in values.items() if value is not None}
