"""Which embedded model a workload runs: the one mapping from the name a workload asks for
(always the tiny model's, so that cell ids stay the same across sets) to the model of
the run's ``--model-set`` (``RunSettings.model_set``: ``auto`` is the reference set on
cuda, the tiny one elsewhere), and the sizes workload dimensions follow.

=================  ================  =========================================
tiny (CPU)         reference (GPU)   what it is
=================  ================  =========================================
tiny-cnn           resnet50          image classifier, fixed input size
tiny-cnn-dynhw     resnet50-dynhw    the same, dynamic height and width
tiny-encoder       bert-base         text encoder, dynamic sequence
tiny-llama         llama-1b          decoder with the embedded tokenizer
=================  ================  =========================================
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.api import RunSettings
from harness.session.config import ModelSet
from workloads.lib import models, refmodels
from workloads.lib.models import EmbeddedModel

REFERENCE_OF = {
    "tiny-cnn": "resnet50",
    "tiny-cnn-dynhw": "resnet50-dynhw",
    "tiny-encoder": "bert-base",
    "tiny-llama": "llama-1b",
}


def chosen(name: str, model_set: ModelSet) -> str:
    """The model of ``model_set`` that stands where a workload names tiny model ``name``."""
    if name not in REFERENCE_OF:
        raise KeyError(f"no embedded model {name!r}; have {', '.join(sorted(REFERENCE_OF))}")
    return REFERENCE_OF[name] if model_set is ModelSet.REFERENCE else name


def embedded(name: str, settings: RunSettings) -> EmbeddedModel:
    """The tensor model of the run's set that stands for ``name``, built on first use."""
    return by_name(chosen(name, settings.model_set), settings.seed)


TENSOR_MODELS = (*models.BUILDERS, *refmodels.BUILDERS)
"""Every embedded tensor model, tiny and reference-sized."""


def by_name(name: str, seed: int) -> EmbeddedModel:
    """The embedded tensor model ``name`` (of either set), built on first use."""
    if name in refmodels.BUILDERS:
        return refmodels.embedded(name, seed)
    return models.embedded(name, seed)


@dataclass(frozen=True)
class Sizes:
    """What workload dimensions follow: the image side a CNN was built for, an encoder's
    position table and vocabulary (None where the model has none)."""

    image: int | None = None
    max_sequence: int | None = None
    vocab: int | None = None


_TINY_TEXT = Sizes(max_sequence=models.TINY_ENCODER.max_sequence, vocab=models.TINY_ENCODER.vocab)
_BERT = Sizes(max_sequence=refmodels.BERT_BASE.max_sequence, vocab=refmodels.BERT_BASE.vocab)
SIZES = {
    "tiny-cnn": Sizes(image=models.IMAGE_SIZE),
    "tiny-cnn-dynhw": Sizes(image=models.IMAGE_SIZE),
    "tiny-encoder": _TINY_TEXT,
    "resnet50": Sizes(image=refmodels.RESNET_IMAGE),
    "resnet50-dynhw": Sizes(image=refmodels.RESNET_IMAGE),
    "bert-base": _BERT,
}


def sizes(name: str, settings: RunSettings) -> Sizes:
    """The sizes of the model that stands for ``name`` in the run's set."""
    return SIZES[chosen(name, settings.model_set)]
