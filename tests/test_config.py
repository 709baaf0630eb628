import importlib.util
import re
from pathlib import Path

import pytest

from harness.exceptions import UsageError
from harness.results.records import Manifest
from harness.session.config import PROFILES, ProfileName
from harness.session.execution import ClientsOn, Dist, Distribution, parse_dist
from harness.session.pytestoptions import parse_settings
from harness.session.state import check_resumable


def settings(**kw):
    base = dict(engine=None, device="cpu", profile="quick", results_dir="results/runs", seed=0)
    base.update(kw)
    return parse_settings(**base)


def test_defaults_are_the_embedded_quick_run():
    s = settings()
    assert s.engines == ("onnxruntime",)
    assert s.profile == PROFILES[ProfileName.QUICK]
    assert s.model is None
    assert s.results_dir == Path("results/runs")


def test_engines_split_on_commas_and_deduplicate():
    assert settings(engine=["onnxruntime", "onnxruntime,onnxruntime"]).engines == ("onnxruntime",)


def test_overrides_replace_profile_windows():
    s = settings(profile="full", window=45, requests=10)
    assert s.profile.name is ProfileName.FULL
    assert (s.profile.window_s, s.profile.requests) == (45, 10)
    assert s.profile.policy == PROFILES[ProfileName.FULL].policy


def test_model_path_is_resolved(tmp_path):
    f = tmp_path / "m.onnx"
    f.write_bytes(b"x")
    assert settings(model=str(f)).model == f.resolve()


def test_dims_and_engine_options_parse():
    s = settings(dim=["sequence=128"], engine_opt=["onnxruntime.intra_op_threads=1"])
    assert s.dims == {"sequence": 128}
    assert s.engine_options == {"onnxruntime": {"intra_op_threads": "1"}}
    assert s.to_json()["engine_options"] == {"onnxruntime": {"intra_op_threads": "1"}}


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"device": "cuda:x"}, "use cpu, cuda or cuda:N"),
        ({"device": "cpu:0"}, "use cpu, cuda or cuda:N"),
        ({"window": 0.0}, "--window must be a positive"),
        ({"dim": ["noequals"]}, "expected KEY=VALUE"),
        ({"dim": ["h=0"]}, "positive integer"),
    ],
)
def test_usage_errors(kw, message):
    with pytest.raises(UsageError, match=message):
        settings(**kw)


def test_images_folder_is_resolved_and_recorded(tmp_path):
    (tmp_path / "a.JPG").write_bytes(b"x")
    s = settings(images=str(tmp_path))
    assert s.images == tmp_path.resolve()
    assert s.to_json()["images"] == str(tmp_path.resolve())
    assert settings().to_json()["images"] is None


def test_images_must_be_a_folder_with_images(tmp_path):
    with pytest.raises(UsageError, match="is not a directory"):
        settings(images=str(tmp_path / "nope"))
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(UsageError, match=r"holds no \.jpg, \.jpeg, \.png file"):
        settings(images=str(tmp_path))


def test_resume_accepts_older_manifests_and_another_distribution():
    settings = parse_settings(
        engine=["null"], device="cpu", profile="quick", results_dir="r", seed=0
    )
    old = settings.to_json()
    del old["clients"]  # written before --clients existed
    old["dist"] = Distribution(mode=Dist.RAY, address="h:1").to_json()
    manifest = Manifest(run_id="r1", state="incomplete", created_at="t", settings=old)
    check_resumable(manifest, settings)  # no usage error
    changed = dict(old, seed=3)
    with pytest.raises(UsageError, match="seed: was 3, now 0"):
        check_resumable(manifest.model_copy(update={"settings": changed}), settings)


def test_clients_on_ray_is_validated_at_configuration(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    real = importlib.util.find_spec  # Ray stands as installed
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "ray" else real(name)
    )
    two = dict(engine=["openai"], clients=2)
    with pytest.raises(UsageError, match="--clients-on 'mars': choose local or ray"):
        settings(**two, clients_on="mars")
    with pytest.raises(UsageError, match=r"give --clients N \(N >= 2\)"):
        settings(engine=["openai"], clients_on="ray")
    with pytest.raises(UsageError, match="needs the cluster: give --ray-address"):
        settings(**two, clients_on="ray")
    on_cluster = settings(**two, clients_on="ray", ray_address="10.0.0.1:6379")
    assert on_cluster.clients_on is ClientsOn.RAY
    assert on_cluster.to_json()["clients_on"] == "ray"
    # a --cells-on=ray node: the cluster it runs on comes in RAY_ADDRESS
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert settings(**two, clients_on="ray").clients_on is ClientsOn.RAY
    assert settings(**two).clients_on is ClientsOn.LOCAL


def test_ray_address_without_dist_ray_only_for_clients_on_ray(monkeypatch):
    args = dict(mode="local", cpus_per_cell=1.0, gpus_per_cell=1.0, retries=2, python=None)
    with pytest.raises(UsageError, match="only applies with --cells-on=ray or --clients-on=ray"):
        parse_dist(**args, address="h:1", isolation="process")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "ray" else real(name)
    )
    dist = parse_dist(**args, address="h:1", isolation="process", clients_on="ray")
    assert (dist.mode, dist.address) == (Dist.LOCAL, "h:1")
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name)
    )
    with pytest.raises(UsageError, match=r"--clients-on=ray needs Ray: pip install"):
        parse_dist(**args, address="h:1", isolation="process", clients_on="ray")


@pytest.mark.parametrize(
    ("profile", "window", "floor"), [("quick", 1.0, "1"), ("quick", 0.5, "1"), ("full", 30, "30")]
)
def test_a_window_no_cell_can_be_valid_in_is_refused(profile, window, floor):
    """At or below the profile's minimum measured window every windowed cell is invalid:
    such a run measured nothing usable and exited 0."""
    with pytest.raises(UsageError, match=rf"measured window of at least {floor} s"):
        settings(profile=profile, window=window)
    assert settings(profile=profile, window=float(floor) * 1.2).profile.window_s > float(floor)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"slo": "ttft_p99=abc"}, "'abc' is not a duration; give a number with s, ms or us"),
        ({"slo": "e2e_p99=1s,e2e_p99=2s"}, "e2e_p99 is given twice"),
        ({"slo": "e2e_pabc=1s"}, "pabc is not a percentile"),
        ({"slo": "e2e_p99=1s,e2e_p99.9=2s"}, None),
        (
            {
                "engine_opt": [
                    "onnxruntime.intra_op_threads=1",
                    "onnxruntime.intra_op_threads=2",
                ]
            },
            "--engine-opt onnxruntime.intra_op_threads is given twice ('1' and '2')",
        ),
        ({"dim": ["sequence=8", "sequence=16"]}, "--dim sequence is given twice"),
    ],
)
def test_ambiguous_or_malformed_values_are_usage_errors(kw, message):
    """Last-one-wins hid a mistake; a Python conversion error told nothing."""
    if message is None:
        assert len(settings(**kw).slos) == 2
        return
    with pytest.raises(UsageError, match=re.escape(message)):
        settings(**kw)
