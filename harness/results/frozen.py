"""The frozen base of every pydantic model the harness writes or reads: records and the
manifest (``records``), a workload's report declaration (``reportspec``) and compare's
JSON (harness.report.compare). Immutable, no unknown fields, and infinity / NaN written
as the strings JSON lacks ("Infinity")."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="strings")
