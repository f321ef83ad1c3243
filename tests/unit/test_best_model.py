"""transformers' --load_best_model_at_end / --metric_for_best_model / --greater_is_better,
--label_smoothing_factor and --config_name, with their meanings there."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification
from transformers.trainer_pt_utils import LabelSmoother

from horovod_train.config.parsing import parse_run_config
from horovod_train.engines.dp import LossPerReplica
from horovod_train.outputs.run_directory import RunDirectory
from horovod_train.tasks.single_label import SingleLabel, training_loss


def tiny_classifier(num_labels: int = 3) -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, num_labels=num_labels, initializer_range=0.5)  # fmt: skip
    return BertForSequenceClassification(config).eval()  # confident logits: smoothing changes the loss


@pytest.mark.parametrize(("given", "metric", "greater"), [
    ([], "eval_loss", False),
    (["--metric_for_best_model", "accuracy"], "eval_accuracy", True),
    (["--metric_for_best_model", "eval_validation_mismatched_loss"], "eval_validation_mismatched_loss", False),
    (["--metric_for_best_model", "f1", "--greater_is_better", "false"], "eval_f1", False),
])  # fmt: skip
def test_metric_for_best_model_defaults_as_in_transformers(given, metric, greater):
    training = parse_run_config(["--load_best_model_at_end", *given]).training
    assert (training.metric_for_best_model, training.greater_is_better) == (metric, greater)


def test_label_smoothing_is_transformers_label_smoother():
    model = tiny_classifier()
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 60, (6, 9), generator=generator)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.tensor([0, 1, 2, 2, 1, 0])}
    with torch.no_grad():
        outputs = model(**{k: v for k, v in batch.items() if k != "labels"})
        expected = LabelSmoother(0.2)(outputs, batch["labels"])
        assert training_loss(model, batch, 0.2).item() == pytest.approx(expected.item(), rel=1e-6)
        # evaluation's per-example losses are the same formula: their mean is the training loss
        evaluated = SingleLabel(num_labels=3).losses(outputs.logits, batch["labels"], 0.2)
        assert evaluated.shape == (6,) and evaluated.mean().item() == pytest.approx(expected.item(), rel=1e-6)
        # DataParallel's replicas compute the same loss; 0 is the model's own cross-entropy
        assert LossPerReplica(model)(label_smoothing=0.2, **batch)[0].item() == pytest.approx(expected.item(), rel=1e-6)
        assert training_loss(model, batch, 0.0).item() == pytest.approx(model(**batch).loss.item(), rel=1e-6)
        assert expected.item() != pytest.approx(model(**batch).loss.item(), rel=1e-3)


@pytest.mark.parametrize(("keep", "best", "left"), [
    (1, "checkpoint-4", ["checkpoint-4", "checkpoint-8"]),  # a limit of 1 keeps the best and the newest
    (1, "checkpoint-8", ["checkpoint-8"]),
    (2, "checkpoint-2", ["checkpoint-2", "checkpoint-8"]),
    (3, "checkpoint-4", ["checkpoint-4", "checkpoint-6", "checkpoint-8"]),
    (2, None, ["checkpoint-6", "checkpoint-8"]),
    (None, "checkpoint-4", ["checkpoint-2", "checkpoint-4", "checkpoint-6", "checkpoint-8"]),
])  # fmt: skip
def test_rotation_spares_the_best_checkpoint_as_transformers_does(tmp_path, keep, best, left):
    from horovod_train.outputs.checkpoint import Checkpoints

    names = [f"checkpoint-{step}" for step in (2, 4, 6, 8)]
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "manifest.json").write_text("{}\n")  # rotation deletes only a checkpoint it knows whole
    Checkpoints(RunDirectory(tmp_path), keep, names).rotate(keep_also="checkpoint-8", best=best)
    assert sorted(p.name for p in tmp_path.iterdir()) == left
