"""Models and tokenizers: anything AutoModelForSequenceClassification loads, plus 'tiny-bert'
(a small BERT, random init, with a WordPiece tokenizer trained locally on the training text)."""

from __future__ import annotations

import hashlib
import re
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    BertTokenizerFast,
    PreTrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.modeling_outputs import SequenceClassifierOutputWithPast

from horovod_train.common.errors import UsageError
from horovod_train.common.files import atomic_directory
from horovod_train.data.glue import offline_error, offline_unless_reachable
from horovod_train.tasks.base import TaskShape
from horovod_train.tasks.single_label import SingleLabel

T = TypeVar("T")
TINY_BERT = "tiny-bert"
TINY_BERT_CONFIG = dict(
    hidden_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=256,
    max_position_embeddings=256,
    # A wider init than BERT's 0.02: from 0.02 this small model sits at chance for epochs first.
    initializer_range=0.1,
    # Dropout 0.1 keeps this small model at chance on synthetic-nli; --dropout overrides.
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)
TINY_VOCAB_SIZE = 2000
# bert-base-cased's architecture, built locally (no download): about 108M parameters in ~200 tensors. The
# benchmarks measure it, and the GPU check trains it (random init, `--config_name` with tiny-bert's tokenizer).
BERT_BASE_CASED = dict(
    vocab_size=28996,
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    max_position_embeddings=512,
    type_vocab_size=2,
)
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# The names transformers' configurations give their dropout probabilities: hidden_dropout_prob (BERT, RoBERTa),
# dropout and seq_classif_dropout (DistilBERT), mlp_dropout (ModernBERT), attention_dropout (Llama, Qwen2),
# resid_pdrop (GPT-2), dropout_rate (T5). Not layerdrop or drop_path_rate: those skip whole layers.
DROPOUT_NAME = re.compile(r"(dropout|dropout_prob|dropout_rate|pdrop)$")
# The families whose learned position embeddings count from padding_idx + 1 (RoBERTa's scheme, transformers'
# create_position_ids_from_input_ids): of max_position_embeddings, padding_idx + 1 are never a token's position.
# padding_idx is the configuration's pad_token_id (None here), or what the family's code fixes (MPNet: 1).
# Their configurations do not say so; tests/unit/test_model_families.py checks those that embed input ids alone.
POSITIONS_AFTER_PADDING: dict[str, int | None] = {
    **dict.fromkeys(["roberta", "xlm-roberta", "camembert", "longformer", "roberta-prelayernorm", "xlm-roberta-xl",
                     "data2vec-text", "ibert", "luke", "markuplm", "esm", "xmod", "lilt", "layoutlmv3"]),
    "mpnet": 1,
}  # fmt: skip


def train_wordpiece_tokenizer(texts: Iterable[str], save_dir: Path) -> None:
    from tokenizers import BertWordPieceTokenizer

    tokenizer = BertWordPieceTokenizer(lowercase=False)
    tokenizer.train_from_iterator(texts, vocab_size=TINY_VOCAB_SIZE, special_tokens=SPECIAL_TOKENS, show_progress=False)
    # transformers 5 ignores vocab_file here: hand over the trained tokenizer object itself.
    BertTokenizerFast(tokenizer_object=tokenizer._tokenizer, do_lower_case=False).save_pretrained(save_dir)


def tiny_tokenizer_dir(cache_dir: Path, texts: list[str]) -> Path:
    digest = hashlib.sha256("\n".join(texts).encode()).hexdigest()[:16]
    return cache_dir / "tokenizers" / f"tiny-bert-wordpiece-{TINY_VOCAB_SIZE}-{digest}"


def prepare_tiny_tokenizer(target: Path, texts: list[str]) -> None:
    """Train and save once; a concurrent writer (another node on a shared filesystem) is harmless."""
    if target.is_dir():
        return
    with atomic_directory(target) as tmp:
        train_wordpiece_tokenizer(texts, tmp)


def tiny_tokenizer_files(target: Path, texts: list[str]) -> dict[str, bytes]:
    """The tokenizer's files, trained first if this cache has none."""
    prepare_tiny_tokenizer(target, texts)
    return {path.name: path.read_bytes() for path in sorted(target.iterdir()) if path.is_file()}


def install_tokenizer_files(target: Path, files: dict[str, bytes]) -> None:
    """Rank 0's tokenizer in this node's cache. The tokenizers library breaks ties between equally frequent
    merges in hash order, so two nodes that each train one on the same texts get different vocabularies (and
    their ranks would train on different token ids): a node-local cache holding another one is replaced."""
    if target.is_dir() and {p.name: p.read_bytes() for p in target.iterdir() if p.is_file()} == files:
        return
    with atomic_directory(target, replace=True) as tmp:
        for name, data in files.items():
            (tmp / name).write_bytes(data)


@dataclass(frozen=True)
class HubAccess:
    """How a model is fetched and trusted: run_glue's --model_revision, --token and --trust_remote_code."""

    revision: str = "main"
    token: str | None = None
    trust_remote_code: bool = False

    def kwargs(self) -> dict:
        return {"revision": self.revision, "token": self.token, "trust_remote_code": self.trust_remote_code}


def loading_error(what: str, name: str, exc: Exception) -> UsageError:
    """One line for a model, config or tokenizer that did not load, with the fix for the usual causes."""
    message = str(exc)
    first = message.strip().splitlines()[0][:160] if message.strip() else type(exc).__name__
    if "trust_remote_code" in message:
        fix = f"pass --trust_remote_code if you trust the code {name} ships (read it first: it runs on every rank)"
    elif "gated" in message or "401" in message or "403" in message:
        fix = "pass --token (or set HF_TOKEN) of an account granted access, or download it on a login node"
    elif (Path(name) / "adapter_config.json").is_file():  # a --use_peft run's adapter/, or peft's save_pretrained
        fix = (
            f"{name} holds a peft adapter, not a model: pass the model it adapts (base_model_name_or_path in its "
            "adapter_config.json), or the merged model beside a --use_peft run's adapter/ (its output directory)"
        )
    else:
        fix = "pass a local model directory, 'tiny-bert', or a hub name with network access"
    return offline_error(what, name, exc) or UsageError(f"cannot load {what} {name!r} ({first})", fix)


def _loaded(what: str, name: str, load: Callable[[], T]) -> T:
    """``load()`` of ``name`` (from the hub where it is not a local directory, once the hub's reachability is known:
    offline_unless_reachable), its failure as one line."""
    offline_unless_reachable(name)
    try:
        return load()
    except (OSError, ValueError) as exc:
        raise loading_error(what, name, exc) from None


def load_tokenizer(
    name_or_path: str, cache_dir: str | None = None, access: HubAccess = HubAccess()
) -> PreTrainedTokenizerBase:
    tokenizer = _loaded(
        "tokenizer",
        name_or_path,
        lambda: AutoTokenizer.from_pretrained(name_or_path, cache_dir=cache_dir, **access.kwargs()),
    )
    return with_pad_token(tokenizer, name_or_path)


def with_pad_token(tokenizer: PreTrainedTokenizerBase, name: str) -> PreTrainedTokenizerBase:
    """Decoder LLM tokenizers (Llama, Mistral) have no pad token: batches are padded with EOS, as users of
    their *ForSequenceClassification do; the model then pools the last token that is not padding."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise UsageError(
                f"tokenizer {name!r} has neither a pad token nor an EOS token to pad batches with",
                "add a pad token to it (tokenizer.add_special_tokens({'pad_token': '<pad>'}), then save_pretrained "
                "it and the model with resized embeddings)",
            )
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_config(
    name: str, cache_dir: str | None, labels: dict, access: HubAccess = HubAccess(), what: str = "config"
) -> PreTrainedConfig:
    """``what``: "model" where the configuration is the model's own (no --config_name), for the error."""
    return _loaded(
        what, name, lambda: AutoConfig.from_pretrained(name, cache_dir=cache_dir, **labels, **access.kwargs())
    )


def trained_label_names(model: Any, access: HubAccess = HubAccess()) -> tuple[str, ...] | None:
    """The label names a pretrained classifier was trained with (its configuration's id2label in id order, or
    --config_name's), whose order the run's labels take where they are the same (data/labels.in_model_order). None
    for tiny-bert, a configuration without names of its own (LABEL_0, ...), or one that does not load (the model's
    loading says why)."""
    if model.model_name_or_path == TINY_BERT:
        return None  # random init: its head has no labels yet
    name = model.config_name or model.model_name_or_path
    offline_unless_reachable(name)
    try:
        config = AutoConfig.from_pretrained(name, cache_dir=model.cache_dir, **access.kwargs())
    except (OSError, ValueError):
        return None
    names = tuple(str(config.id2label[i]) for i in sorted(config.id2label))
    return None if names == tuple(f"LABEL_{i}" for i in range(len(names))) else names


def usable_positions(config: PreTrainedConfig) -> int | None:
    """How many tokens a sequence of this model can have: its max_position_embeddings, less the positions
    RoBERTa-like families reserve up to padding_idx (40 embeddings, pad_token_id 1: 38 tokens)."""
    positions = getattr(config, "max_position_embeddings", None)
    if not isinstance(positions, int) or positions <= 0:
        return None
    if config.model_type not in POSITIONS_AFTER_PADDING:
        return positions
    padding_idx = POSITIONS_AFTER_PADDING[config.model_type]
    return positions - (config.pad_token_id or 0 if padding_idx is None else padding_idx) - 1


def dropout_fields(config: PreTrainedConfig) -> list[tuple[PreTrainedConfig, str]]:
    """(configuration, name) of every dropout probability of ``config`` and of the configurations inside it (a
    multimodal model's text_config). A field left None (BERT's classifier_dropout: "use hidden_dropout_prob")
    is one too; a bool (ESM's token_dropout) is a switch, not a probability."""
    fields = []
    for name, value in vars(config).items():
        if isinstance(value, PreTrainedConfig):
            fields += dropout_fields(value)
        elif DROPOUT_NAME.search(name) and (value is None or type(value) in (int, float)):
            fields.append((config, name))
    return fields


def set_dropout(config: PreTrainedConfig, dropout: float | None) -> None:
    """--dropout: every dropout probability of the model, whatever its family names them."""
    if dropout is None:
        return
    fields = dropout_fields(config)
    if not fields:
        raise UsageError(
            f"--dropout: {type(config).__name__} ({config.model_type}) has no dropout setting to override",
            "drop --dropout (this model's dropout is what its configuration and code fix)",
        )
    for owner, name in fields:
        setattr(owner, name, dropout)


def build_model(
    model_name_or_path: str,
    num_labels: int,
    label_names: list[str],
    vocab_size: int,
    seed: int,
    dropout: float | None = None,
    cache_dir: str | None = None,
    config_name: str | None = None,
    pad_token_id: int | None = None,
    access: HubAccess = HubAccess(),
    shape: type[TaskShape] = SingleLabel,
    on_meta: bool = False,
) -> PreTrainedModel:
    """``config_name`` (run_glue.py's --config_name): the configuration to load the weights into, or with
    tiny-bert the architecture to random-init instead of the built-in tiny one. ``pad_token_id``: the
    tokenizer's, given to a model configuration that has none (decoders find the last real token by it).
    ``shape``: the task's, whose transformers ``problem_type`` (regression: MSE on one output;
    multi_label_classification: BCE-with-logits; single_label_classification: cross-entropy) the configuration
    carries, so that the model's loss never guesses it from the labels' dtype. ``on_meta``: the model's shape
    alone, on the meta device (no memory, no weights read): what a sharded engine's ranks but rank 0 start from,
    or a count of its parameters."""
    labels = {
        "num_labels": num_labels,
        "id2label": dict(enumerate(label_names)),
        "label2id": {name: i for i, name in enumerate(label_names)},
        "problem_type": shape.problem_type,
    }
    model = _build_model(model_name_or_path, labels, vocab_size, seed, dropout, cache_dir, config_name, access,
                         on_meta)  # fmt: skip
    if model.config.pad_token_id is None and pad_token_id is not None:
        model.config.pad_token_id = pad_token_id
    return model


def model_config(
    model_name_or_path: str,
    labels: dict,
    vocab_size: int,
    cache_dir: str | None,
    config_name: str | None,
    access: HubAccess,
) -> PreTrainedConfig:
    """The configuration the model is built in: --config_name's, else tiny-bert's built-in one or the model's own
    (whose weights are then loaded into it)."""
    if config_name:
        config = load_config(config_name, cache_dir, labels, access)
    elif model_name_or_path == TINY_BERT:
        config = BertConfig(**labels, **TINY_BERT_CONFIG)
    else:
        return load_config(model_name_or_path, cache_dir, labels, access, what="model")
    if model_name_or_path == TINY_BERT:
        config.vocab_size = vocab_size  # the tokenizer trained on the run's data
    return config


def _build_model(
    model_name_or_path: str,
    labels: dict,
    vocab_size: int,
    seed: int,
    dropout: float | None,
    cache_dir: str | None,
    config_name: str | None,
    access: HubAccess,
    on_meta: bool = False,
) -> PreTrainedModel:
    config = model_config(model_name_or_path, labels, vocab_size, cache_dir, config_name, access)
    set_dropout(config, dropout)
    torch.manual_seed(seed)  # same random init on every rank (rank 0's is broadcast anyway)
    if on_meta:
        with torch.device("meta"):  # a model with custom code needs the user's --trust_remote_code here too
            model = AutoModelForSequenceClassification.from_config(
                config, dtype=torch.float32, trust_remote_code=access.trust_remote_code
            )
    elif model_name_or_path == TINY_BERT:
        return AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
    else:
        model = _from_pretrained(model_name_or_path, config, cache_dir, access)
    embeddings = model.get_input_embeddings().num_embeddings
    if embeddings < vocab_size:
        raise UsageError(
            f"tokenizer has {vocab_size} tokens but model {model_name_or_path!r} embeds only {embeddings}",
            "use the tokenizer that belongs to the model (drop --tokenizer_name)",
        )
    return model


def _from_pretrained(
    model_name_or_path: str, config: PreTrainedConfig, cache_dir: str | None, access: HubAccess
) -> PreTrainedModel:
    return _loaded("model", model_name_or_path, lambda: AutoModelForSequenceClassification.from_pretrained(
        model_name_or_path,
        config=config,
        cache_dir=cache_dir,
        ignore_mismatched_sizes=True,
        # transformers 5 loads in the saved dtype by default; training needs fp32 master weights (AMP casts)
        dtype=torch.float32,
        **access.kwargs(),
    ))  # fmt: skip


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """Non-reentrant checkpointing (torch's recommended kind): gradients reach every parameter in one backward
    pass, so DDP's reducer sees each once (the reentrant kind marks parameters ready twice, or never)."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise UsageError(
            f"{type(model).__name__} does not support gradient checkpointing",
            "drop --gradient_checkpointing (or lower --per_device_train_batch_size to save memory)",
        )
    non_reentrant = {"use_reentrant": False}
    # transformers' current name (5.x renamed it; the old one warns on every rank), the old one before the rename.
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=non_reentrant)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=non_reentrant)
    model.config.use_cache = False  # decoders: a key/value cache is useless in training and breaks recomputation


# ---- --max_seq_length against the model and its tokenizer -------------------------------------------------------
TOKENIZER_UNLIMITED = 10**6  # a tokenizer's model_max_length at or above this means "no limit" (transformers: 1e30)


def _model_positions(model: Any) -> tuple[int, str] | None:
    """(positions, whose) of the model the run builds: tiny-bert's, else --config_name's or the model's config."""
    name = model.config_name or model.model_name_or_path
    if name == TINY_BERT:
        return TINY_BERT_CONFIG["max_position_embeddings"], "tiny-bert's position embeddings"
    offline_unless_reachable(name)  # the run's first look at the hub
    try:
        config = AutoConfig.from_pretrained(name, cache_dir=model.cache_dir)
    except (OSError, ValueError):
        return None  # the model's own loading reports it, in its words
    usable = usable_positions(config)
    if usable is None:
        return None
    whose, positions = f"the position embeddings of {name}", config.max_position_embeddings
    if usable < positions:  # RoBERTa's: positions count from its padding index + 1
        whose += f" ({positions}) less the {positions - usable} its padding reserves"
    return usable, whose


def _tokenizer_limit(model: Any) -> tuple[int, str] | None:
    from transformers.models.auto.tokenization_auto import get_tokenizer_config

    name = model.tokenizer_name or model.model_name_or_path
    if name == TINY_BERT:
        return None  # trained by the run, no limit of its own
    offline_unless_reachable(name)
    try:
        limit = get_tokenizer_config(name, cache_dir=model.cache_dir).get("model_max_length")
    except (OSError, ValueError):
        return None
    if isinstance(limit, int | float) and 0 < limit < TOKENIZER_UNLIMITED:
        return int(limit), f"the model_max_length of tokenizer {name}"
    return None


def fit_max_seq_length(config: Any, warn: Callable[[str], None]) -> None:
    """Cap --max_seq_length at what the model and its tokenizer take, with a warning, as run_glue.py does
    (longer sequences would index past the position embeddings). Reads their configurations (the hub, or the
    cache), so it runs where the run starts building, not among the checks of the arguments (domains.py)."""
    limits = [limit for limit in (_model_positions(config.model), _tokenizer_limit(config.model)) if limit]
    if not limits:
        return
    limit, whose = min(limits)
    if config.data.max_seq_length > limit:
        warn(
            f"warning: --max_seq_length {config.data.max_seq_length} is more than {whose} ({limit}): "
            f"using --max_seq_length {limit}"
        )
        config.data.max_seq_length = limit


# The families whose sequence classifier reads the last token through transformers' generic head (a base
# model, then ``score``) and whose base model separates packed sequences by their position ids.
DECODER_FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "phi3")


def enable_padding_free(model: PreTrainedModel) -> None:
    """--padding_free: the model's forward takes flattened batches (data/loaders.FlattenedBatches: a batch's examples
    end to end in one row, ``position_ids`` restarting per example, ``example_ends``), which transformers' packed-
    sequence masks (sdpa, eager, flex, flash) keep apart, the classifier reading each example's last token; and
    padded ones (evaluation's). In place, so that an engine's wrapper and torch.compile see the same module. An
    encoder attends both ways, and transformers' encoders do not split a row by position ids: refused."""
    family = model.config.model_type
    if family not in DECODER_FAMILIES or not hasattr(model, "score"):
        raise UsageError(
            f"--padding_free needs a decoder model ({', '.join(DECODER_FAMILIES)}); {family} attends both ways "
            "over padded batches",
            "drop --padding_free (--length_buckets or --group_by_length pad less)",
        )
    padded = model.forward

    def forward(self: PreTrainedModel, *args: Any, example_ends: torch.Tensor | None = None, **batch: Any) -> Any:
        if example_ends is None:
            return padded(*args, **batch)
        labels = batch.pop("labels", None)
        # no cache: transformers separates packed sequences by their position ids only without one
        hidden = self.base_model(**batch, use_cache=False).last_hidden_state  # [1, tokens, hidden]
        logits = self.score(hidden[0, example_ends])  # each example's last token: [examples, labels]
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, pooled_logits=logits, config=self.config)
        return SequenceClassifierOutputWithPast(loss=loss, logits=logits)

    model.forward = types.MethodType(forward, model)
