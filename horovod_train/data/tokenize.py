"""Tokenization as run_glue.py's preprocess_function does it, cached on disk: the tokenized splits are keyed
by everything their token ids depend on (each split's content, the label names, the tokenizer, the length),
so a run tokenizes once and every later run with the same inputs maps the cache. The digests that key it
also identify a tokenizer and a tokenized split for a checkpoint's compatibility check."""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset, DatasetDict, load_from_disk
from transformers import PreTrainedTokenizerBase

from horovod_train.common.files import atomic_directory
from horovod_train.data.columns import LABEL_COLUMN, text_columns
from horovod_train.data.labels import label_names

DIGEST_BATCH_ROWS = 10_000


def content_digest(*parts: object) -> str:
    """A digest of datasets (by their Arrow content) and plain values, the same on every rank. A dataset is
    hashed a batch of rows at a time, so that a split larger than memory is not copied into it."""
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, Dataset):
            for batch in part.with_format("arrow").iter(batch_size=DIGEST_BATCH_ROWS):
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, batch.schema) as writer:
                    writer.write_table(batch)
                h.update(sink.getvalue())
            h.update(f"rows:{len(part)};".encode())
        else:
            h.update(repr(part).encode())
    return h.hexdigest()[:20]


def tokenized_cache_path(
    raw: DatasetDict, tokenizer: PreTrainedTokenizerBase, max_seq_length: int, cache_dir: Path, pad: bool = False
) -> Path:
    """The tokenized splits' cache entry, keyed by everything their ids depend on: each split's content (its
    text columns, in order, and labels), the label names, the tokenizer (tokenizer_digest), the length and,
    padded to it in the cache, the pad id, type id and side."""
    splits = [part for name in raw for part in (name, raw[name])]
    padding = (tokenizer.pad_token_id, tokenizer.pad_token_type_id, tokenizer.padding_side) if pad else None
    digest = content_digest(*splits, label_names(raw), tokenizer_digest(tokenizer), max_seq_length, padding)
    return cache_dir / "tokenized" / digest


def tokenize_to_disk(
    raw: DatasetDict,
    tokenizer: PreTrainedTokenizerBase,
    max_seq_length: int,
    target: Path,
    pad: bool = False,
    overwrite: bool = False,
    num_proc: int | None = None,
) -> None:
    """Tokenize every split into ``target`` unless it is there (``overwrite``: again). ``pad``: every
    example to ``max_seq_length`` (run_glue's --pad_to_max_length), else the collator pads per batch.
    ``num_proc`` processes tokenize contiguous shards (run_glue's --preprocessing_num_workers): the same
    data as one. The tokenized splits go through files beside ``target``, never into memory whole."""
    if target.is_dir() and not overwrite:
        return
    columns = text_columns(raw)
    encode = encoder(tokenizer, columns, max_seq_length, pad)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}.", suffix=".map") as work:
        files = {name: str(Path(work) / f"{name}.arrow") for name in raw}
        encoded = raw.map(encode, batched=True, remove_columns=columns, num_proc=num_proc if num_proc != 1 else None,
                          cache_file_names=files, load_from_cache_file=False, desc=None)  # fmt: skip
        encoded = encoded.rename_column(LABEL_COLUMN, "labels")
        with atomic_directory(target, replace=overwrite) as tmp:
            encoded.save_to_disk(str(tmp))


def encoder(
    tokenizer: PreTrainedTokenizerBase, columns: list[str], max_seq_length: int, pad: bool
) -> Callable[[dict], dict]:
    """A batch of examples' tokenizer outputs (input_ids, ...), as the tokenized data holds them."""
    padding = "max_length" if pad else False

    def encode(batch: dict) -> dict:
        return tokenizer(*(batch[c] for c in columns), padding=padding, truncation=True, max_length=max_seq_length)

    return encode


def load_tokenized(path: Path) -> DatasetDict:
    return load_from_disk(str(path))


# A tokenizer's init settings that do not change its ids: where it was loaded from (its files' content is
# keyed instead), decoding and chat options, model_max_length (a run truncates at --max_seq_length), and the
# added tokens as loaded (the tokenizer's own, added since too, are keyed instead).
NOT_ENCODING = frozenset({
    "name_or_path", "is_local", "local_files_only", "_commit_hash", "cache_dir", "revision", "token",
    "trust_remote_code", "model_max_length", "clean_up_tokenization_spaces", "spaces_between_special_tokens",
    "chat_template", "processor_class", "auto_map", "device_map", "added_tokens_decoder",
})  # fmt: skip


def tokenizer_digest(tokenizer: PreTrainedTokenizerBase) -> str:
    """Identifies the ids a tokenizer gives (the tokenized data's cache key, a checkpoint's tokenizer check):
    its class, vocabulary, normalizer, pre-tokenizer, post-processor, added and special tokens, settings
    (do_lower_case, ...), truncation side and outputs; not where it was loaded from."""
    tokens = sorted((i, repr(token)) for i, token in tokenizer.added_tokens_decoder.items())
    # The form's name: a checkpoint that recorded another form (class and vocabulary alone, before issue 34)
    # resumes with a warning instead of a mismatch (checkpoint.Compatibility).
    return "tokenizer-v2:" + content_digest(
        type(tokenizer).__name__, sorted(tokenizer.get_vocab().items()), _backend_state(tokenizer), tokens,
        sorted(tokenizer.special_tokens_map.items()), _encoding_settings(tokenizer), tokenizer.truncation_side,
        list(tokenizer.model_input_names),
    )  # fmt: skip


def _backend_state(tokenizer: PreTrainedTokenizerBase) -> str | None:
    """A Rust-backed tokenizer's tokenizer.json (normalizer, pre-tokenizer, model, post-processor, added tokens),
    less the truncation and padding that transformers sets at each call from the call's own arguments."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    state = json.loads(backend.to_str())
    state.pop("truncation", None)
    state.pop("padding", None)
    return json.dumps(state, sort_keys=True)


def _encoding_settings(tokenizer: PreTrainedTokenizerBase) -> list[tuple[str, str]]:
    """The tokenizer's init settings (do_lower_case, strip_accents, add_prefix_space, special tokens, ...)
    but its file paths and NOT_ENCODING."""
    files = set(getattr(tokenizer, "vocab_files_names", {}))
    return sorted(
        (name, repr(value))
        for name, value in tokenizer.init_kwargs.items()
        if name not in NOT_ENCODING and name not in files and not name.endswith(("_file", "_files"))
    )


def dataset_digest(dataset: Dataset) -> str:
    """A digest of a tokenized split's content (each column's values and list lengths), whatever the Arrow
    chunking of the files it was read from; one column at a time, without copying the split."""
    table = dataset.with_format("arrow")[0 : len(dataset)]  # the selected rows, in order
    h = hashlib.sha256()
    for name in sorted(table.column_names):
        column = table.column(name)
        h.update(f"{name}:{column.type}:{column.null_count};".encode())
        while pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
            h.update(pc.list_value_length(column).fill_null(-1).to_numpy().tobytes())
            column = pc.list_flatten(column)
        if pa.types.is_integer(column.type) or pa.types.is_floating(column.type):
            h.update(column.fill_null(0).to_numpy().tobytes())
        else:  # not in tokenized data; exact but slow
            h.update(repr(column.to_pylist()).encode())
    return h.hexdigest()[:20]
