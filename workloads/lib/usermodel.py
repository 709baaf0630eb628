"""The user's ``--model``, checked once before a run and prepared the way the run asks.

Which engines read ``--model`` how (their ``load()`` in ``engines/``), by family:

* generative engines (vllm, openai, tensorrt-llm, lmdeploy) take it as it is, usually a
  Hugging Face directory: nothing is checked here;
* tensor engines load a model file, and every one of them runs the embedded ONNX models,
  so ONNX is what the family shares: a folder, an empty file, a file that is not ONNX or
  an input without a leading batch dimension stops the run with one message. torch also
  loads a ``torch.export`` ``.pt2`` file, which is passed on unchecked;
* ``null`` reads no model at all.

``--dynamic-batch`` serves a copy whose fixed batch dimension is dynamic, cached under
``$HARNESS_CACHE_DIR/models/derived`` beside a note of what was rewritten (or why it was
refused), so that worker processes reuse both instead of redoing them.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from engines.onnxprep import (
    ModelError,
    OnnxModel,
    RewriteRefused,
    fixed_batch,
    inspect,
    make_batch_dynamic,
)
from harness.api import Family, RunSettings, TensorSpec, cache_root, registry
from workloads.lib import inputs, models, modelset

MODEL_FREE = frozenset({"null"})
"""Tensor engines that read no model file."""
OTHER_FORMATS: dict[str, tuple[str, ...]] = {"torch": (".pt2",)}
"""Tensor engines that also load a non-ONNX file, by suffix."""
REWRITE_VERSION = 1  # bump when make_batch_dynamic changes, so cached copies are redone

__all__ = [
    "ModelError",
    "UserModel",
    "batch_conflict",
    "check",
    "fixed_batch",
    "prepared",
    "user_model",
]


@dataclass(frozen=True)
class UserModel:
    """``--model`` as the engines will load it."""

    source: Path
    path: Path
    """What engines load: ``source``, or its derived copy with a dynamic batch."""
    onnx: OnnxModel | None
    """None: a format the harness does not inspect (a torch ``.pt2``)."""
    dynamic_batch: bool = False
    """Whether ``--dynamic-batch`` asked for a dynamic batch."""
    rewritten: tuple[str, ...] = ()
    refused: str | None = None
    """Why ``--dynamic-batch`` could not be applied (the model is then served as it is)."""

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {"path": str(self.source), "loaded": str(self.path)}
        if self.onnx is not None:
            info |= self.onnx.describe()
        if self.refused:
            info["dynamic_batch"] = {"refused": self.refused}
        elif self.dynamic_batch:
            info["dynamic_batch"] = {"rewritten": list(self.rewritten)}  # []: already dynamic
        return info


def readers(settings: RunSettings) -> list[str]:
    """The selected engines that load ``--model`` as a model file (tensor engines)."""
    return [
        name
        for name in settings.engines
        if name not in MODEL_FREE and registry.load(name).capabilities.family is Family.TENSOR
    ]


def _is_onnx_for(settings: RunSettings, model: Path) -> bool:
    """Whether the tensor engines will load ``model`` as ONNX (not as a format of their own)."""
    engines = readers(settings)
    other = [e for e in engines if model.suffix in OTHER_FORMATS.get(e, ())]
    if other and len(other) < len(engines):
        onnx_only = ", ".join(e for e in engines if e not in other)
        raise ModelError(
            f"--model {model}: a {model.suffix} file is for {', '.join(other)} only; the"
            f" other tensor engines ({onnx_only}) load ONNX files"
        )
    return not other


def check(settings: RunSettings) -> UserModel | None:
    """Everything about ``--model`` and ``--dim`` that can be known before a cell runs;
    raises ``ModelError`` with the one message the run stops with."""
    model = settings.model
    engines = readers(settings)
    if model is None:
        if engines:
            _check_dims(settings.dims, models.DYNAMIC_DIMS_ALL, "the embedded models")
        return None
    if not engines:
        if settings.dynamic_batch:
            raise ModelError(
                "--dynamic-batch rewrites an ONNX model for tensor engines; none of"
                f" {', '.join(settings.engines)} loads --model as one"
            )
        return None  # generative engines take --model as it is (a directory for vllm)
    if model.is_dir():
        raise ModelError(
            f"--model {model} is a directory; tensor engines ({', '.join(engines)}) load a"
            " model file (.onnx); a model directory is for generative engines such as vllm"
        )
    if not _is_onnx_for(settings, model):
        if settings.dynamic_batch:
            raise ModelError(f"--dynamic-batch rewrites ONNX models; {model.name} is not one")
        return UserModel(model, model, None)
    if importlib.util.find_spec("onnx") is None:
        return None  # the engine's own load will say what is missing
    try:
        found = prepared(model, settings.dynamic_batch)
    except ModelError as exc:
        raise ModelError(f"--model {exc}") from None
    assert found.onnx is not None  # an ONNX file was inspected
    _check_dims(settings.dims, inputs.dim_names(found.onnx.inputs), model.name, found.onnx)
    return found


def _check_dims(
    dims: Iterable[str], known: Collection[str], owner: str, onnx: OnnxModel | None = None
) -> None:
    unknown = [d for d in dims if d not in known]
    if not unknown:
        return
    if known:
        have = f"whose dynamic dimensions are: {', '.join(sorted(known))}"
    else:
        shapes = "; ".join(f"{s.name} {list(s.shape)}" for s in onnx.inputs) if onnx else ""
        have = f"which has none besides the batch (inputs: {shapes})"
    raise ModelError(
        f"--dim {', '.join(unknown)}: not a dynamic dimension of {owner}, {have}; the batch"
        " dimension is sized by the workloads"
    )


def user_model(settings: RunSettings, engine: str) -> UserModel | None:
    """``--model`` as tensor engine ``engine`` loads it (prepared once per process)."""
    model = settings.model
    if model is None:
        return None
    if engine in MODEL_FREE or model.suffix in OTHER_FORMATS.get(engine, ()):
        return UserModel(model, model, None)
    return prepared(model, settings.dynamic_batch)


def prepared(model: Path, dynamic_batch: bool) -> UserModel:
    """Inspect ``model`` and, asked to, make its batch dynamic (a derived, cached copy)."""
    return _prepared(model, dynamic_batch, cache_root())


@functools.lru_cache(maxsize=4)
def _prepared(model: Path, dynamic_batch: bool, cache: Path) -> UserModel:
    onnx = inspect(model)
    if not dynamic_batch or onnx.fixed_batch is None:
        return UserModel(model, model, onnx, dynamic_batch)
    digest = hashlib.sha256(model.read_bytes()).hexdigest()[:16]
    stem = cache / "models" / "derived" / f"{model.stem}-{digest}-r{REWRITE_VERSION}.dynbatch"
    target, note = stem.with_name(f"{stem.name}.onnx"), stem.with_name(f"{stem.name}.json")
    done = _read_note(note)
    if done is None or ("rewritten" in done and not target.is_file()):
        done = _rewrite(model, target)
        try:
            _write_note(note, done)
        except OSError as exc:
            raise ModelError(f"{model}: cannot cache its rewritten copy: {exc}") from None
    if "refused" in done:
        return UserModel(model, model, onnx, True, refused=str(done["refused"]))
    return UserModel(model, target, inspect(target), True, rewritten=tuple(done["rewritten"]))


def _rewrite(model: Path, target: Path) -> dict[str, Any]:
    try:
        return {"rewritten": make_batch_dynamic(model, target)}
    except RewriteRefused as exc:
        return {"refused": str(exc)}
    except OSError as exc:
        raise ModelError(f"{model}: cannot write its rewritten copy: {exc}") from None


def _read_note(note: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(note.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_note(note: Path, data: dict[str, Any]) -> None:
    note.parent.mkdir(parents=True, exist_ok=True)
    tmp = note.with_name(f".tmp-{os.getpid()}-{note.name}")
    tmp.write_text(json.dumps(data, sort_keys=True))
    os.replace(tmp, note)


def batch_conflict(
    specs: Iterable[TensorSpec], sizes: Collection[int], model: UserModel | None
) -> str | None:
    """Why a model with a fixed batch cannot serve batches of ``sizes``, or None."""
    specs = tuple(specs)
    fixed = fixed_batch(specs)
    if fixed is None or set(sizes) == {fixed}:
        return None
    shapes = "; ".join(f"{s.name} {list(s.shape)}" for s in specs)
    reason = f"the model's batch dimension is fixed at {fixed} ({shapes}); this cell sends"
    reason += f" batches of {_sizes(sizes)}"
    if model is not None and model.refused:
        return f"{reason}; --dynamic-batch could not help: {model.refused}"
    return f"{reason}; --dynamic-batch serves a copy of it whose batch dimension is dynamic"


def _sizes(sizes: Collection[int]) -> str:
    """``1 to 8`` for a run of sizes, else ``8 and 64``."""
    ordered = sorted(set(sizes))
    if len(ordered) > 2 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"{ordered[0]} to {ordered[-1]}"
    return " and ".join(", ".join(map(str, ordered)).rsplit(", ", 1))


def open_model(
    open_engine: Any, cell: Any, settings: Any, default: str, batches: Collection[int] = (1,)
) -> Any:
    """Load ``--model`` if given (as ``workloads.lib.usermodel`` prepared it), else the embedded
    model that stands for ``default`` in the run's model set (``workloads.lib.modelset``), as
    a tensor engine of the cell; skips the cell when the model's fixed batch dimension
    cannot take the ``batches`` sizes the cell sends."""
    from harness.api import EngineError, TensorEngine  # noqa: PLC0415

    user = user_model(settings, cell.engine)
    embedded_model = None if user else modelset.embedded(default, settings)
    engine = open_engine(user.path if user else embedded_model.path)  # type: ignore[union-attr]
    if not isinstance(engine, TensorEngine):
        raise EngineError(f"{cell.engine} is not a tensor engine")
    if embedded_model is not None:
        cell.engine_info["embedded_model"] = embedded_model.describe()
    if user is not None:
        cell.engine_info["user_model"] = user.describe()
    conflict = batch_conflict(engine.input_specs(), batches, user)
    if conflict:
        pytest.skip(conflict)
    return engine
