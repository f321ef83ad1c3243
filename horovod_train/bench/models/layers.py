"""Gradient tensor sizes (parameter counts, forward order) of the models the scaling model is checked on.

The CNNs are written out from their published architectures, so that the totals can be checked against
the published parameter counts (tests/integration/test_scaling_model.py):

- VGG-16: Simonyan & Zisserman 2015, configuration D (13 3x3 convolutions + 3 fully connected layers,
  weights and biases): 138,357,544 parameters (torchvision's and Keras' vgg16 tables).
- ResNet-50/101: He et al. 2016, Table 1 (bottleneck blocks [3, 4, 6, 3] / [3, 4, 23, 3]), laid out as
  torchvision does (convolutions without bias, batch norm scale and shift): 25,557,032 / 44,549,160.
- Inception V3: Szegedy et al. 2016, as Keras' InceptionV3 builds it (convolutions without bias, batch
  norm with shift only, 1000-class classifier): 23,817,352 trainable parameters.
BERT models and the 0.5B decoder are built from their configs on the meta device (no memory, no download).
"""

from __future__ import annotations

from collections.abc import Iterator

from horovod_train.common.errors import UsageError

Conv = tuple[int, int, int, int]  # kernel height, kernel width, in channels, out channels


def vgg16() -> list[int]:
    channels = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]
    sizes, cin = [], 3
    for c in channels:
        if c != "M":
            sizes += [9 * cin * int(c), int(c)]
            cin = int(c)
    for fan_in, fan_out in ((512 * 7 * 7, 4096), (4096, 4096), (4096, 1000)):
        sizes += [fan_in * fan_out, fan_out]
    return sizes


def _conv_bn(kh: int, kw: int, cin: int, cout: int) -> list[int]:
    return [kh * kw * cin * cout, cout, cout]  # conv weight, batch norm weight and bias


def resnet(blocks: tuple[int, ...]) -> list[int]:
    sizes, cin = _conv_bn(7, 7, 3, 64), 64
    for stage, count in enumerate(blocks):
        width = 64 * 2**stage
        for block in range(count):
            sizes += _conv_bn(1, 1, cin, width) + _conv_bn(3, 3, width, width) + _conv_bn(1, 1, width, 4 * width)
            if block == 0:
                sizes += _conv_bn(1, 1, cin, 4 * width)  # the projection shortcut
            cin = 4 * width
    return sizes + [cin * 1000, 1000]


def _inception_a(cin: int, pool: int) -> Iterator[Conv]:
    yield from [(1, 1, cin, 64), (1, 1, cin, 48), (5, 5, 48, 64), (1, 1, cin, 64), (3, 3, 64, 96)]
    yield from [(3, 3, 96, 96), (1, 1, cin, pool)]


def _inception_c(c: int) -> Iterator[Conv]:
    yield from [(1, 1, 768, 192), (1, 1, 768, c), (1, 7, c, c), (7, 1, c, 192), (1, 1, 768, c), (7, 1, c, c)]
    yield from [(1, 7, c, c), (7, 1, c, c), (1, 7, c, 192), (1, 1, 768, 192)]


def _inception_e(cin: int) -> Iterator[Conv]:
    yield from [(1, 1, cin, 320), (1, 1, cin, 384), (1, 3, 384, 384), (3, 1, 384, 384), (1, 1, cin, 448)]
    yield from [(3, 3, 448, 384), (1, 3, 384, 384), (3, 1, 384, 384), (1, 1, cin, 192)]


def inception_v3_convs() -> Iterator[Conv]:
    yield from [(3, 3, 3, 32), (3, 3, 32, 32), (3, 3, 32, 64), (1, 1, 64, 80), (3, 3, 80, 192)]
    yield from _inception_a(192, 32)
    yield from _inception_a(256, 64)
    yield from _inception_a(288, 64)
    yield from [(3, 3, 288, 384), (1, 1, 288, 64), (3, 3, 64, 96), (3, 3, 96, 96)]  # grid reduction
    for c in (128, 160, 160, 192):
        yield from _inception_c(c)
    yield from [(1, 1, 768, 192), (3, 3, 192, 320), (1, 1, 768, 192), (1, 7, 192, 192), (7, 1, 192, 192)]
    yield (3, 3, 192, 192)  # the second grid reduction's last convolution
    yield from _inception_e(1280)
    yield from _inception_e(2048)


def inception_v3() -> list[int]:
    sizes = []
    for kh, kw, cin, cout in inception_v3_convs():
        sizes += [kh * kw * cin * cout, cout]  # Keras: no conv bias, batch norm shift only (scale=False)
    return sizes + [2048 * 1000, 1000]


# bert-large-uncased: bert-base's layout, wider and deeper (Devlin et al. 2019).
BERT_LARGE = {"vocab_size": 30522, "hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16}


def transformer(name: str, lora_r: int | None = None) -> list[int]:
    """The trainable tensors: every one, or with ``lora_r`` LoRA's adapters and the head (as --use_peft trains)."""
    import torch
    from transformers import AutoModelForSequenceClassification, BertConfig

    from horovod_train.bench import architectures
    from horovod_train.models import lora
    from horovod_train.models.model import BERT_BASE_CASED

    large = {**BERT_BASE_CASED, **BERT_LARGE, "intermediate_size": 4096}
    if name == "decoder-0.5b":
        config = architectures.decoder_config()
    else:
        config = BertConfig(num_labels=3, **large) if name == "bert-large" else architectures.bert_config(name)
    with torch.device("meta"):
        model = AutoModelForSequenceClassification.from_config(config)
        model = lora.wrap(model, lora.LoraOptions(r=lora_r)) if lora_r else model
    return [p.numel() for p in model.parameters() if p.requires_grad]


CNNS = {
    "vgg-16": vgg16,
    "resnet-50": lambda: resnet((3, 4, 6, 3)),
    "resnet-101": lambda: resnet((3, 4, 23, 3)),
    "inception-v3": inception_v3,
}
MODELS = (*CNNS, "tiny-bert", "bert-base-cased", "bert-large", "decoder-0.5b")


def parameter_counts(name: str, lora_r: int | None = None) -> list[int]:
    """Trainable tensors' sizes; ``lora_r`` (transformers only): with LoRA adapters of that rank."""
    if name in CNNS:
        if lora_r:
            raise UsageError(f"--lora_r applies to the transformers, not {name}", "drop --lora_r or pick a BERT")
        return CNNS[name]()
    return transformer(name, lora_r)
