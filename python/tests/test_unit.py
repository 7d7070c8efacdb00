"""What needs no coordinator: spec conversion, error parsing, config.json, the HTML card,
the client's settings."""

import json
import math

import grpc
import pytest

import tandem
from tandem import specs
from tandem._html import job_html, loss_svg
from tandem._proto import common_pb2, coordinator_pb2, spec_pb2
from tandem.errors import parse_field_errors


def test_spec_sources(tmp_path):
    assert specs.spec_source({"steps": 3}) == ("spec_yaml", '{\n "steps": 3\n}')
    assert specs.spec_source("steps: 3\n") == ("spec_yaml", "steps: 3\n")
    assert specs.spec_source("{steps: 3}") == ("spec_yaml", "{steps: 3}")
    f = tmp_path / "job.yaml"
    f.write_text("steps: 4\n")
    assert specs.spec_source(str(f)) == ("spec_yaml", "steps: 4\n")
    assert specs.spec_source(f) == ("spec_yaml", "steps: 4\n")
    message = spec_pb2.JobSpec(steps=5)
    assert specs.spec_source(message) == ("spec", message)
    with pytest.raises(FileNotFoundError):
        specs.spec_source("nowhere.yaml")
    with pytest.raises(ValueError):
        specs.spec_source({"optimizer": {"lr": math.nan}})
    with pytest.raises(TypeError):
        specs.spec_source(42)


def test_to_message():
    m = specs.to_message({"steps": 3, "model": {"preset": "gpt2-tiny"}})
    assert m.steps == 3 and m.model.preset == "gpt2-tiny"
    with pytest.raises(ValueError):
        specs.to_message({"model": {"bogus": 1}})


def test_parse_field_errors():
    text = ("pipeline.stages: must be in [1, 4096], got 0 (line 4)\n"
            "pipeline.cuts[1]: must increase (line 9, column 5)\n"
            "model: a: b inside (not a place)\n"
            "data.map[a: b]: odd key\n"
            "pipeline.schedule: does not fit\n"
            "  1F0 1B0\n"
            "  2F0\n"
            "a line without a path\n")
    errors = parse_field_errors(text)
    assert [e.path for e in errors] == ["pipeline.stages", "pipeline.cuts[1]", "model",
                                        "data.map[a: b]", "pipeline.schedule", ""]
    assert (errors[0].line, errors[0].column, errors[0].message) == (4, 0, "must be in [1, 4096], got 0")
    assert (errors[1].line, errors[1].column) == (9, 5)
    assert errors[2].message == "a: b inside (not a place)"
    assert errors[4].message == "does not fit\n  1F0 1B0\n  2F0"
    assert errors[5].message == "a line without a path"
    assert str(errors[1]) == "pipeline.cuts[1]: must increase (line 9, column 5)"


def test_hf_config():
    gpt2 = {"arch": "gpt", "vocab_size": 50304, "seq_len": 1024, "d_model": 768, "n_layer": 12,
            "n_head": 12, "d_hidden": 0, "tie_embeddings": True}
    c = tandem.hf_config(gpt2)
    assert c["vocab_size"] == 50257 and c["n_inner"] == 3072
    llama = {"arch": "llama", "d_model": 64, "d_hidden": 192, "n_layer": 2, "n_head": 4,
             "n_kv_head": 2, "vocab_size": 256, "seq_len": 32, "rope_theta": 10000.0,
             "rms_eps": 1e-5, "tie_embeddings": False}
    text = tandem.hf_config_json(llama)
    assert text.endswith("}\n") and '"rope_theta": 10000.0' in text and '"rms_norm_eps": 1e-05' in text
    assert json.loads(text)["head_dim"] == 16
    assert tandem.hf_config({"arch": "mlp_lm"}) is None


def test_every_step_summary_field_is_mapped():
    # A field added to StepSummary must be given an attribute of Step, or listed as unmapped.
    fields = {f.name for f in coordinator_pb2.StepSummary.DESCRIPTOR.fields}
    mapped = {f for f in tandem.Step.__dataclass_fields__ if f != "raw"}
    assert fields - mapped == set(tandem.Step.UNMAPPED)


def test_checkpoint_failures_and_warning_events_are_mapped():
    job = coordinator_pb2.Job(id="job-1", checkpoint_step=3, checkpoint_failures=2,
                              last_checkpoint_failure="checkpoint after step 6 not stored (full)")
    status = tandem.JobStatus.from_proto(job)
    assert status.checkpoint_step == 3 and status.checkpoint_failures == 2
    assert status.last_checkpoint_failure == "checkpoint after step 6 not stored (full)"
    event = coordinator_pb2.JobEvent(kind=coordinator_pb2.JobEvent.WARNING, job_id="job-1",
                                     state=2, reason="checkpoint after step 6 not stored (full)")
    e = tandem.Event.from_proto(event)
    assert e.kind == "warning" and e.reason == "checkpoint after step 6 not stored (full)"
    assert e.step is None and e.job is None


def test_speed_checks_of_served_profiles_are_mapped():
    said = "checked now: layer 0 2.2/2.0 ms (x1.100); the model x1.100: priced at x1.100"
    profile = common_pb2.ModelProfile(key="k", device="cpu", threads=1, speed_check=said)
    assert tandem.ModelProfile.from_proto(profile).speed_check == said
    assert tandem.ModelProfile.from_proto(common_pb2.ModelProfile(key="k")).speed_check == ""
    plan = coordinator_pb2.PlanJobResponse(chosen=-1, choice="none fits",
                                           profile_speed_check=said)
    assert tandem.Plan.from_proto(plan).profile_speed_check == said
    assert tandem.Plan.from_proto(plan).chosen is None


def test_export_refuses_a_disk_that_cannot_hold_the_model(tmp_path):
    from tandem.client import _check_free_space
    _check_free_space(str(tmp_path / "model.safetensors"), 1 << 10)  # fits: no error
    with pytest.raises(tandem.TandemError) as e:
        _check_free_space(str(tmp_path / "model.safetensors"), 1 << 60)
    assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "export: the model is %d bytes and %s has " % (1 << 60, tmp_path) in e.value.message


def test_prediction_check_is_the_coordinators():
    # The coordinator makes the check (coordinator/prediction_check.h, its rules tested in
    # tests/coordinator/prediction_check_test.cc); the client maps it, every miss by name.
    job = coordinator_pb2.Job(id="job-1", predicted_step_seconds=10.0)
    assert tandem.PredictionCheck.of(job) is None  # no check made: no prediction, or too few
    job.prediction_check.CopyFrom(coordinator_pb2.PredictionCheck(
        steps=7, first_step=1, last_step=7, predicted_seconds=10.0, measured_seconds=11.9,
        pipeline_measured_seconds=11.7, pipeline_replayed_seconds=11.5, stage_ratio_low=1.2,
        stage_ratio_high=1.22, tolerance=0.03, miss=coordinator_pb2.PREDICTION_MISS_COSTS,
        summary="11.900 s per step, median of steps 2-8: x1.190 the prediction; ..."))
    c = tandem.PredictionCheck.of(job)
    assert (c.steps, c.first_step, c.last_step) == (7, 1, 7)
    assert c.ratio == pytest.approx(1.19) and not c.within and c.miss == "costs"
    assert (c.stage_ratio_low, c.stage_ratio_high, c.tolerance) == (1.2, 1.22, 0.03)
    assert c.summary.startswith("11.900 s per step, median of steps 2-8")
    names = {coordinator_pb2.PREDICTION_WITHIN: "",
             coordinator_pb2.PREDICTION_MISS_SCHEDULE: "schedule",
             coordinator_pb2.PREDICTION_MISS_COSTS: "costs",
             coordinator_pb2.PREDICTION_MISS_SCHEDULE_AND_COSTS: "schedule and costs",
             coordinator_pb2.PREDICTION_MISS_UPDATE_OR_CALLS: "update or calls",
             coordinator_pb2.PREDICTION_MISS_UNKNOWN: "unknown",
             coordinator_pb2.PREDICTION_MISS_TRANSFERS: "transfers",
             coordinator_pb2.PREDICTION_MISS_TRANSFERS_AND_COSTS: "transfers and costs"}
    assert set(names) == set(coordinator_pb2.PredictionMiss.values())  # every miss is named
    for value, name in names.items():
        job.prediction_check.miss = value
        assert tandem.PredictionCheck.of(job).miss == name
    job.prediction_check.miss = coordinator_pb2.PREDICTION_WITHIN
    assert tandem.PredictionCheck.of(job).within


def _step(i, loss, val=None):
    s = coordinator_pb2.StepSummary(step=i, loss=loss, step_seconds=0.01, tokens_per_second=100)
    if val is not None:
        s.has_val_loss, s.val_loss = True, val
    return tandem.Step.from_proto(s)


def test_html_card_escapes_and_draws():
    job = coordinator_pb2.Job(id="job-1", name="n", state=4, reason="<script>x</script>",
                              steps_done=2, total_steps=4)
    status = tandem.JobStatus.from_proto(job)
    page = job_html(status, [_step(0, 5.0), _step(1, 4.0, val=4.5)])
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "FAILED" in page and "step 2 / 4 (50%)" in page
    assert "<polyline" in page and "<circle" in page
    assert loss_svg([]) == ""
    assert loss_svg([_step(0, float("nan"))]) == ""
    assert "<polyline" in loss_svg([_step(0, 1.0)])  # one point, flat range


def test_client_settings(tmp_path, monkeypatch):
    for v in ("TANDEM_COORDINATOR", "TANDEM_TLS_CA", "TANDEM_TLS_CERT", "TANDEM_TLS_KEY",
              "TANDEM_TOKEN", "TANDEM_TOKEN_FILE", "TANDEM_TLS_SERVER_NAME"):
        monkeypatch.delenv(v, raising=False)
    assert tandem.Client().address == "127.0.0.1:7070"
    monkeypatch.setenv("TANDEM_COORDINATOR", "10.0.0.1:7000")
    assert tandem.Client().address == "10.0.0.1:7000"
    assert tandem.Client("h:1").address == "h:1"
    with pytest.raises(ValueError, match="only over TLS"):
        tandem.Client(token="0123456789abcdef")
    monkeypatch.setenv("TANDEM_TOKEN", "0123456789abcdef")
    with pytest.raises(ValueError, match="only over TLS"):
        tandem.Client()
    monkeypatch.delenv("TANDEM_TOKEN")
    with pytest.raises(ValueError, match="both"):
        tandem.Client(tls_ca="x", cert="c.crt")
    with pytest.raises(ValueError, match="cannot read"):
        tandem.Client(tls_ca=str(tmp_path / "missing.crt"))
    with pytest.raises(ValueError):
        tandem.Client("has space:1")


def test_unreachable_coordinator_is_unavailable():
    with tandem.Client("127.0.0.1:1", timeout=2) as c:
        with pytest.raises(tandem.TandemError) as e:
            c.jobs()
    assert e.value.code == grpc.StatusCode.UNAVAILABLE
    assert "127.0.0.1:1" in e.value.message
