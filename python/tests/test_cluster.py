"""The client against a real coordinator and two real CPU workers (conftest.Cluster)."""

import json
import os
import struct
import subprocess
import sys
import time
import types

import grpc
import pytest

import tandem
from conftest import REPO, TINY_STEPS, tiny_spec

WATCH_TIMEOUT = 120  # seconds; a tiny job takes well under one


def f32(x):
    """x rounded to float32, as the proto's float fields hold it."""
    return struct.unpack("f", struct.pack("f", x))[0]


def test_workers_are_listed(client):
    workers = client.workers()
    assert len(workers) == 2
    assert {w.device for w in workers} == {"cpu"}
    assert all(w.state in ("IDLE", "BUSY") for w in workers)
    # The hardware each registered: its processor and the GEMM kernels OpenBLAS chose.
    assert all(" / OpenBLAS " in w.device_name for w in workers)
    assert client.worker(workers[0].worker_id).address == workers[0].address


def test_submit_dict_and_watch_to_succeeded(client):
    job = client.submit(tiny_spec("from-dict"))
    events = list(job.watch(timeout=WATCH_TIMEOUT))
    assert events[0].kind == "snapshot" and events[0].job.id == job.id
    steps = [e.step.step for e in events if e.kind == "step"]
    assert steps == list(range(TINY_STEPS))
    assert events[-1].kind == "state" and events[-1].state == "SUCCEEDED"
    status = job.status()
    assert status.state == "SUCCEEDED" and status.done
    assert status.steps_done == status.total_steps == TINY_STEPS
    assert status.spec["model"]["preset"] == "gpt2-tiny"
    assert status.spec["model"]["n_layer"] == 2  # the preset, resolved by the coordinator
    assert any(j.id == job.id and j.state == "SUCCEEDED" for j in client.jobs())


YAML = """\
# A comment, and flow and block style, as a user writes them.
name: from-yaml
steps: 4
model: {preset: llama-tiny}
pipeline:
  stages: 2
  micro_batch_size: 2
  micro_batches: 2
  partition: uniform
"""


def test_submit_yaml_text_file_and_path(client, tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(YAML)
    jobs = [client.submit(YAML), client.submit(str(path)), client.submit(path)]
    for job in jobs:
        status = job.wait(timeout=WATCH_TIMEOUT)
        assert status.state == "SUCCEEDED", status.reason
        assert status.name == "from-yaml" and status.spec["model"]["arch"] == "llama"
    with pytest.raises(FileNotFoundError):
        client.submit(str(tmp_path / "missing.yaml"))


def test_history_matches_tandem_status_json(client, cluster):
    job = client.submit(tiny_spec("history"))
    job.wait(timeout=WATCH_TIMEOUT)
    cli = json.loads(cluster.cli("status", job.id, "-o", "json"))
    history = job.history()
    assert len(history) == len(cli["history"]) == TINY_STEPS
    for ours, theirs in zip(history, cli["history"]):
        assert ours.step == int(theirs["step"])
        for field in ("loss", "step_seconds", "tokens_per_second", "grad_norm", "bubble_measured",
                      "bubble_predicted", "mfu", "coordinator_overhead_seconds",
                      "max_worker_exec_seconds", "max_worker_update_seconds"):
            assert getattr(ours, field) == theirs[field], field
        assert ours.learning_rate == f32(theirs["learning_rate"])
        assert ours.skipped == theirs["skipped"]
        assert ours.bytes_sent == int(theirs["bytes_sent"])
        assert ours.val_loss == (theirs["val_loss"] if theirs["has_val_loss"] else None)
        assert list(ours.stage_seconds) == theirs["stage_seconds"]
    assert sum(s.val_loss is not None for s in history) == 2  # eval every 3 of 6 steps
    status = job.status()
    assert status.state == cli["state"] and status.steps_done == int(cli["steps_done"])
    assert status.last_loss == cli["last_loss"]
    # after_step: only the later steps.
    assert [s.step for s in job.history(after_step=3)] == [4, 5]


def test_history_as_frame(client):
    pd = pytest.importorskip("pandas")
    job = client.submit(tiny_spec("frame"))
    job.wait(timeout=WATCH_TIMEOUT)
    frame = job.history(as_frame=True)
    assert isinstance(frame, pd.DataFrame)
    assert list(frame.index) == list(range(TINY_STEPS))
    assert frame.index.name == "step" and "loss" in frame.columns
    assert frame["val_loss"].notna().sum() == 2


def test_cancel_a_running_job(client):
    job = client.submit(tiny_spec("to-cancel", steps=100000))
    for event in job.watch(timeout=WATCH_TIMEOUT):
        if event.kind == "step":
            break  # it runs: cancel it
    status = job.cancel()
    assert status.state in ("RUNNING", "CANCELLED")  # a running job stops asynchronously
    with pytest.raises(tandem.JobFailed) as failed:
        job.wait(timeout=WATCH_TIMEOUT)
    assert failed.value.code == grpc.StatusCode.ABORTED
    assert failed.value.job.state == "CANCELLED"
    final = job.wait(timeout=WATCH_TIMEOUT, raise_on_failure=False)
    assert final.steps_done < 100000 and "cancelled" in final.reason
    with pytest.raises(tandem.TandemError) as e:
        job.cancel()
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION


def test_cancel_a_queued_job(client):
    # Two jobs that each need both workers: the second queues behind the first.
    first = client.submit(tiny_spec("first", steps=100000))
    second = client.submit(tiny_spec("queued"))
    try:
        assert second.status().state == "QUEUED"
        assert second.cancel().state == "CANCELLED"
    finally:
        first.cancel()
    assert first.wait(timeout=WATCH_TIMEOUT, raise_on_failure=False).state == "CANCELLED"


def test_bad_spec_raises_with_field_paths(client):
    before = len(client.jobs())
    spec = tiny_spec("bad", pipeline={"stages": 0}, model={"n_layer": -1})
    with pytest.raises(tandem.SpecError) as e:
        client.submit(spec)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert set(e.value.paths) == {"pipeline.stages", "model.n_layer"}
    # The line is the field's in the JSON sent (to_json, indent 1).
    lines = tandem.specs.to_json(spec).split("\n")
    for error in e.value.field_errors:
        key = error.path.split(".")[-1]
        assert '"%s"' % key in lines[error.line - 1], error
    with pytest.raises(tandem.SpecError) as e:
        client.submit("name: x\nmodel:\n  preset: gpt2-tiny\n  bogus: 1\n")
    (error,) = e.value.field_errors
    assert (error.path, error.line, error.column) == ("model.bogus", 4, 3)
    assert "unknown field" in error.message
    assert len(client.jobs()) == before  # nothing was stored


def test_unknown_job_is_not_found(client):
    with pytest.raises(tandem.TandemError) as e:
        client.job("job-999999").status()
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    assert "job-999999" in e.value.message


def test_trace(client, tmp_path):
    job = client.submit(tiny_spec("trace"))
    job.wait(timeout=WATCH_TIMEOUT)
    latest = job.trace(path=str(tmp_path / "trace.json"))
    assert latest["traceEvents"]
    assert json.loads((tmp_path / "trace.json").read_text()) == latest
    svg = job.trace(2, svg=True)
    assert "<svg" in svg
    assert job.trace(steps=(1, 3))["traceEvents"]
    with pytest.raises(tandem.TandemError) as e:
        job.trace(10 ** 6)
    assert e.value.code == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("preset", ["gpt2-tiny", "llama-tiny"])
def test_export_matches_the_cli(client, cluster, tmp_path, preset):
    job = client.submit(tiny_spec("export", model={"preset": preset}))
    job.wait(timeout=WATCH_TIMEOUT)
    ours = tmp_path / "ours" / "model.safetensors"
    theirs = tmp_path / "cli" / "model.safetensors"
    ours.parent.mkdir()
    theirs.parent.mkdir()
    result = job.export(str(ours))
    cluster.cli("export", job.id, "-o", str(theirs))
    assert result.bytes == ours.stat().st_size > 0
    assert ours.read_bytes() == theirs.read_bytes()
    assert result.config_path == str(tmp_path / "ours" / "config.json")
    assert (tmp_path / "ours" / "config.json").read_text() == \
        (tmp_path / "cli" / "config.json").read_text()
    assert not os.path.exists(str(ours) + ".tmp")


def test_profile(client):
    profile = client.profile(tiny_spec("profile"))
    assert len(profile.layers) == 2 + 2  # embedding, 2 blocks, head
    assert all(l.forward_seconds > 0 for l in profile.layers)
    # Kept per hardware: the key ends with the name of the workers it was timed on.
    assert profile.device_name and profile.key.endswith("-on-" + profile.device_name)
    with pytest.raises(tandem.SpecError) as e:
        client.profile(tiny_spec("profile", pipeline={"micro_batches": 0}))
    assert "pipeline.micro_batches" in e.value.paths


def test_plan(client):
    # Two stages of micro-batches of 2, 4 sequences in all: the planner tries every split and
    # schedule on the two idle workers and says which it would run; nothing is submitted.
    before = len(client.jobs())
    plan = client.plan(tiny_spec("plan", pipeline={"partition": "profile"}))
    assert plan.chosen is not None and plan.chosen is plan.candidates[0]
    assert plan.chosen.feasible and plan.chosen.step_seconds > 0
    assert plan.chosen.schedule in plan.choice
    assert plan.as_written_step_seconds is not None
    assert plan.as_written_step_seconds >= plan.chosen.step_seconds
    for c in plan.candidates:
        assert c.micro_batches * c.micro_batch_size * c.replicas == 4
        assert c.feasible or c.reason
    assert len(client.jobs()) == before
    with pytest.raises(tandem.SpecError) as e:
        client.plan(tiny_spec("plan", pipeline={"micro_batches": 0}))
    assert "pipeline.micro_batches" in e.value.paths


def test_prediction_check_of_a_profiled_job(client):
    # Priced from the profile, then measured: the steady steps (not step 0, not the last,
    # not those followed by the eval every 3 steps) against the prediction, as `tandem status`.
    job = client.submit(tiny_spec("checked", pipeline={"partition": "profile"}))
    assert job.wait(timeout=WATCH_TIMEOUT).state == "SUCCEEDED"
    c = job.prediction_check()
    assert c is not None and c.predicted_seconds == job.status().predicted_step_seconds
    assert (c.steps, c.first_step, c.last_step) == (3, 1, 4)  # of 0..5: not 0, 2, 5
    assert c.measured_seconds > 0 and c.pipeline_measured_seconds > 0
    assert c.pipeline_replayed_seconds > 0 and c.stage_ratio_high >= c.stage_ratio_low > 0
    assert c.miss in ("", "schedule", "costs", "schedule and costs", "transfers",
                      "transfers and costs", "update or calls")
    assert " s per step, median of steps 2-5: x" in c.summary  # as `tandem status` prints it
    assert job.prediction_check(recent=2) is None  # steps 4 and 5: 5 is the last


def test_repr_html_and_watch_progress(client, monkeypatch):
    bars = []

    class FakeTqdm:  # records what watch(progress=True) does with its bar
        def __init__(self, **kwargs):
            self.n, self.total, self.closed = 0, kwargs.get("total"), False
            bars.append(self)

        def update(self, k):
            self.n += k

        def refresh(self):
            pass

        def set_postfix(self, **kwargs):
            self.postfix = kwargs

        def set_description(self, text):
            self.description = text

        def close(self):
            self.closed = True

    fake = types.ModuleType("tqdm.auto")
    fake.tqdm = FakeTqdm
    monkeypatch.setitem(sys.modules, "tqdm", types.ModuleType("tqdm"))
    monkeypatch.setitem(sys.modules, "tqdm.auto", fake)
    job = client.submit(tiny_spec("notebook"))
    job.wait(timeout=WATCH_TIMEOUT, progress=True)
    (bar,) = bars
    assert (bar.n, bar.total, bar.closed) == (TINY_STEPS, TINY_STEPS, True)
    assert "loss" in bar.postfix and "SUCCEEDED" in bar.description
    page = job._repr_html_()
    assert job.id in page and "SUCCEEDED" in page
    assert "<svg" in page and "<polyline" in page and "<circle" in page  # loss and val loss
    assert "step 6 / 6" in page


def test_plot(client):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    job = client.submit(tiny_spec("plot"))
    job.wait(timeout=WATCH_TIMEOUT)
    ax = job.plot()
    assert len(ax.get_lines()) == 2


def test_environment_as_the_cli(cluster, monkeypatch):
    monkeypatch.setenv("TANDEM_COORDINATOR", cluster.address)
    with tandem.Client() as c:
        assert c.address == cluster.address
        assert len(c.workers()) == 2


def test_lr_sweep_example_runs(cluster):
    env = dict(os.environ, TANDEM_COORDINATOR=cluster.address)
    start = time.monotonic()
    run = subprocess.run([sys.executable, os.path.join(REPO, "examples", "lr_sweep.py"),
                          "--steps", "6", "--preset", "gpt2-tiny"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = [l for l in run.stdout.splitlines() if l.startswith("job-")]
    assert len(rows) == 3, run.stdout
    assert all("SUCCEEDED" in r for r in rows), run.stdout
    assert time.monotonic() - start < 300
