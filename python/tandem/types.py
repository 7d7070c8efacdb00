"""Plain dataclasses over the coordinator's messages (proto/tandem/v1/coordinator.proto).

Each keeps the message it came from in `raw` (not compared, not printed) for the fields not
mapped here. Steps are numbered by their 0-based index, as StepSummary.step, `tandem status
-o json` and the trace: the step after which N steps are done has index N - 1.
"""

import dataclasses
import datetime
from typing import Any, Dict, Optional, Sequence, Tuple

from google.protobuf import json_format

from tandem._proto import common_pb2, coordinator_pb2

TERMINAL_STATES = ("SUCCEEDED", "FAILED", "CANCELLED")


def _state_name(value: int) -> str:
    return common_pb2.JobState.Name(value)


def _time(unix_ms: int) -> Optional[datetime.datetime]:
    if unix_ms <= 0:
        return None
    return datetime.datetime.fromtimestamp(unix_ms / 1000.0, tz=datetime.timezone.utc)


def message_to_dict(message) -> Dict[str, Any]:
    """A message as `tandem ... -o json` prints it: proto field names, every field present
    (int64 values as numbers here, not JSON strings)."""
    kwargs = dict(preserving_proto_field_name=True)
    try:
        d = json_format.MessageToDict(message, including_default_value_fields=True, **kwargs)
    except TypeError:  # protobuf >= 5.26 renamed the option
        d = json_format.MessageToDict(message, always_print_fields_with_no_presence=True, **kwargs)
    return _ints(message, d)


def _is_repeated(field) -> bool:
    # protobuf >= 7 dropped FieldDescriptor.label for is_repeated (which older ones lack).
    if hasattr(field, "is_repeated"):
        return field.is_repeated
    return field.label == field.LABEL_REPEATED


def _ints(message, d):
    # MessageToDict writes 64-bit integers as strings (JSON's numbers are doubles); give them
    # back as Python ints, walking the descriptor so that string fields stay strings.
    from google.protobuf.descriptor import FieldDescriptor as F

    int64s = (F.TYPE_INT64, F.TYPE_UINT64, F.TYPE_SINT64, F.TYPE_FIXED64, F.TYPE_SFIXED64)
    for field in message.DESCRIPTOR.fields:
        name = field.name
        if name not in d:
            continue
        repeated = _is_repeated(field)
        if field.type in int64s:
            d[name] = [int(v) for v in d[name]] if repeated else int(d[name])
        elif field.type == F.TYPE_MESSAGE and not field.message_type.GetOptions().map_entry:
            value = getattr(message, name)
            if repeated:
                d[name] = [_ints(m, x) for m, x in zip(value, d[name])]
            else:
                d[name] = _ints(value, d[name])
    return d


@dataclasses.dataclass(frozen=True)
class Step:
    """One training step's summary (StepSummary): what `tandem watch` prints per line."""

    step: int                       # 0-based index
    loss: float
    step_seconds: float             # coordinator wall time of the step
    tokens_per_second: float
    grad_norm: float                # global, before clipping
    learning_rate: float
    skipped: bool                   # non-finite gradient: no update applied
    val_loss: Optional[float]       # when a validation pass ran after this step
    bubble_measured: float          # idle share of the workers' time
    bubble_predicted: float
    mfu: float                      # model-FLOPs utilisation (0 when a peak is unknown)
    coordinator_overhead_seconds: float
    max_worker_exec_seconds: float
    max_worker_update_seconds: float  # the slowest worker's optimizer update + gradient-norm pass
    exec_replayed_seconds: float    # the simulator on this step's measured costs (pipeline phase)
    exec_replayed_flights_seconds: float  # the same with the messages at their measured flights
    bytes_sent: int
    peak_activation_bytes: int
    reduced_bytes: int
    busy_seconds: Tuple[float, ...]                 # per rank
    rank_peak_activation_bytes: Tuple[int, ...]     # per rank
    stage_seconds: Tuple[float, ...]                # per stage: F + B per micro-batch
    stage_busy_seconds: Tuple[float, ...]
    stage_comm_seconds: Tuple[float, ...]
    stage_idle_seconds: Tuple[float, ...]
    stage_peak_bytes: Tuple[int, ...]
    stage_reduce_seconds: Tuple[float, ...]
    stage_reduce_exposed_seconds: Tuple[float, ...]
    stage_flight_seconds: Tuple[float, ...]         # per sending stage: its messages' flight
    raw: Any = dataclasses.field(default=None, repr=False, compare=False)

    # StepSummary fields not mapped to an attribute of their own (in `raw`): has_val_loss is
    # val_loss's presence; stage_memory only rides on the latest step (see the proto).
    UNMAPPED = ("has_val_loss", "stage_memory")

    @classmethod
    def from_proto(cls, s: "coordinator_pb2.StepSummary") -> "Step":
        return cls(
            step=s.step, loss=s.loss, step_seconds=s.step_seconds,
            tokens_per_second=s.tokens_per_second, grad_norm=s.grad_norm,
            learning_rate=s.learning_rate, skipped=s.skipped,
            val_loss=s.val_loss if s.has_val_loss else None,
            bubble_measured=s.bubble_measured, bubble_predicted=s.bubble_predicted, mfu=s.mfu,
            coordinator_overhead_seconds=s.coordinator_overhead_seconds,
            max_worker_exec_seconds=s.max_worker_exec_seconds,
            max_worker_update_seconds=s.max_worker_update_seconds,
            exec_replayed_seconds=s.exec_replayed_seconds,
            exec_replayed_flights_seconds=s.exec_replayed_flights_seconds, bytes_sent=s.bytes_sent,
            peak_activation_bytes=s.peak_activation_bytes, reduced_bytes=s.reduced_bytes,
            busy_seconds=tuple(s.busy_seconds),
            rank_peak_activation_bytes=tuple(s.rank_peak_activation_bytes),
            stage_seconds=tuple(s.stage_seconds), stage_busy_seconds=tuple(s.stage_busy_seconds),
            stage_comm_seconds=tuple(s.stage_comm_seconds),
            stage_idle_seconds=tuple(s.stage_idle_seconds),
            stage_peak_bytes=tuple(s.stage_peak_bytes),
            stage_reduce_seconds=tuple(s.stage_reduce_seconds),
            stage_reduce_exposed_seconds=tuple(s.stage_reduce_exposed_seconds),
            stage_flight_seconds=tuple(s.stage_flight_seconds),
            raw=s,
        )


@dataclasses.dataclass(frozen=True)
class Stage:
    """One pipeline stage of a job and the worker holding it (StageAssignment)."""

    stage: int
    worker_id: str
    address: str
    layer_begin: int
    layer_end: int
    actions: str            # its compute actions in text notation, in its worker's order
    rank: int
    predicted_seconds: float
    predicted_bytes: int
    predicted_transfer_seconds: float  # the plan's price of one message the stage sends

    @classmethod
    def from_proto(cls, s) -> "Stage":
        return cls(stage=s.stage, worker_id=s.worker_id, address=s.address,
                   layer_begin=s.layer_begin, layer_end=s.layer_end, actions=s.actions,
                   rank=s.rank, predicted_seconds=s.predicted_seconds,
                   predicted_bytes=s.predicted_bytes,
                   predicted_transfer_seconds=s.predicted_transfer_seconds)


@dataclasses.dataclass(frozen=True)
class JobStatus:
    """A job as the coordinator holds it (Job), without its step history."""

    id: str
    name: str
    state: str                      # QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED
    reason: str                     # why it is queued, failed or cancelled
    steps_done: int
    total_steps: int
    last_loss: Optional[float]      # None before the first step
    last_val_loss: Optional[float]
    created: Optional[datetime.datetime]
    started: Optional[datetime.datetime]
    finished: Optional[datetime.datetime]
    effective_batch: int            # sequences per step
    tokens_per_step: int
    skipped_steps: int
    checkpoint_step: Optional[int]  # the latest complete checkpoint's step, or None
    checkpoint_failures: int        # checkpoints the coordinator could not store (a full disk)
    last_checkpoint_failure: str    # the latest of them: its step and cause
    first_step: int
    restarts: int
    first_failure: str
    steps_redone: int               # steps trained again after faults (since checkpoints)
    peer_recoveries: int            # runs resumed from the state the workers before kept
    resizes: Tuple[Dict[str, Any], ...]  # an elastic job's changes of layout, oldest first
    plan: str                       # pipeline.plan: auto's choice and why
    predicted_step_seconds: float
    predicted_update_seconds: float  # of it, the update phase (norm and optimizer)
    bubble_fraction_ideal: float
    stages: Tuple[Stage, ...]
    spec: Dict[str, Any]            # the spec with every default filled in, as a dict
    raw: Any = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def done(self) -> bool:
        """Whether the job has ended (SUCCEEDED, FAILED or CANCELLED)."""
        return self.state in TERMINAL_STATES

    @property
    def progress(self) -> float:
        """steps_done / total_steps, in [0, 1]."""
        return min(1.0, self.steps_done / self.total_steps) if self.total_steps > 0 else 0.0

    @classmethod
    def from_proto(cls, j: "coordinator_pb2.Job") -> "JobStatus":
        return cls(
            id=j.id, name=j.name, state=_state_name(j.state), reason=j.reason,
            steps_done=j.steps_done, total_steps=j.total_steps,
            last_loss=j.last_loss if j.steps_done > 0 else None,
            last_val_loss=j.last_val_loss if j.has_val_loss else None,
            created=_time(j.created_unix_ms), started=_time(j.started_unix_ms),
            finished=_time(j.finished_unix_ms), effective_batch=j.effective_batch,
            tokens_per_step=j.tokens_per_step, skipped_steps=j.skipped_steps,
            checkpoint_step=j.checkpoint_step if j.checkpoint_step >= 0 else None,
            checkpoint_failures=j.checkpoint_failures,
            last_checkpoint_failure=j.last_checkpoint_failure,
            first_step=j.first_step, restarts=j.restarts, first_failure=j.first_failure,
            steps_redone=j.steps_redone, peer_recoveries=j.peer_recoveries,
            resizes=tuple(message_to_dict(r) for r in j.resizes),
            plan=j.plan, predicted_step_seconds=j.predicted_step_seconds,
            predicted_update_seconds=j.predicted_update_seconds,
            bubble_fraction_ideal=j.bubble_fraction_ideal,
            stages=tuple(Stage.from_proto(s) for s in j.stages),
            spec=message_to_dict(j.spec), raw=j,
        )


_MISS_NAMES = {
    coordinator_pb2.PREDICTION_WITHIN: "",
    coordinator_pb2.PREDICTION_MISS_SCHEDULE: "schedule",
    coordinator_pb2.PREDICTION_MISS_COSTS: "costs",
    coordinator_pb2.PREDICTION_MISS_SCHEDULE_AND_COSTS: "schedule and costs",
    coordinator_pb2.PREDICTION_MISS_UPDATE_OR_CALLS: "update or calls",
    coordinator_pb2.PREDICTION_MISS_UNKNOWN: "unknown",
    coordinator_pb2.PREDICTION_MISS_TRANSFERS: "transfers",
    coordinator_pb2.PREDICTION_MISS_TRANSFERS_AND_COSTS: "transfers and costs",
}


@dataclasses.dataclass(frozen=True)
class PredictionCheck:
    """A job's steady steps against the step its plan predicted, and whose miss a miss is: the
    coordinator's check (Job.prediction_check, coordinator/prediction_check.h), the one `tandem
    status` prints under "Measured" and the dashboard beside the predicted step. Medians over
    the steady steps: not the job's or a resumed run's first step (it warms up), not a finished
    job's last (it also waits for its own update), not one followed by a validation pass."""

    steps: int                          # steady steps counted
    first_step: int                     # the first and last of them (0-based indexes)
    last_step: int
    predicted_seconds: float            # JobStatus.predicted_step_seconds
    measured_seconds: float             # Step.step_seconds
    pipeline_measured_seconds: float    # Step.max_worker_exec_seconds
    pipeline_replayed_seconds: float    # Step.exec_replayed_seconds (0: not on every step)
    stage_ratio_low: float              # each stage's F + B over its predicted time: lowest,
    stage_ratio_high: float             # highest (0: not every stage measured on every step)
    tolerance: float                    # how far measured may sit from predicted (0.03)
    # The replay with the messages at their measured flights (Step.exec_replayed_flights_seconds;
    # 0: not on every step), and each stage's flights over their price: lowest, highest (0: no
    # stage measured one).
    pipeline_flights_seconds: float
    flight_ratio_low: float
    flight_ratio_high: float
    # Whose miss: "" (within the tolerance), "schedule" (replayed on the steps' own costs, the
    # schedule does not give the pipeline time measured), "costs" (the stages ran off their
    # predicted times), "schedule and costs", "transfers" (the replay gives it with the messages
    # at their measured flights: they flew off their price), "transfers and costs", "update or
    # calls" (neither), or "unknown" (no replay and no per-stage times).
    miss: str
    summary: str                        # the line `tandem status` prints

    @property
    def ratio(self) -> float:
        """Measured over predicted."""
        return self.measured_seconds / self.predicted_seconds

    @property
    def within(self) -> bool:
        """Whether the step is within the tolerance of its prediction."""
        return self.miss == ""

    @classmethod
    def from_proto(cls, c: "coordinator_pb2.PredictionCheck") -> "PredictionCheck":
        return cls(
            steps=c.steps, first_step=c.first_step, last_step=c.last_step,
            predicted_seconds=c.predicted_seconds, measured_seconds=c.measured_seconds,
            pipeline_measured_seconds=c.pipeline_measured_seconds,
            pipeline_replayed_seconds=c.pipeline_replayed_seconds,
            stage_ratio_low=c.stage_ratio_low, stage_ratio_high=c.stage_ratio_high,
            tolerance=c.tolerance, pipeline_flights_seconds=c.pipeline_flights_seconds,
            flight_ratio_low=c.flight_ratio_low, flight_ratio_high=c.flight_ratio_high,
            miss=_MISS_NAMES.get(c.miss, "unknown"), summary=c.summary,
        )

    @classmethod
    def of(cls, job: "coordinator_pb2.Job") -> Optional["PredictionCheck"]:
        """The coordinator's check carried by `job`; None where it made none (no prediction,
        or fewer than two steady steps)."""
        return cls.from_proto(job.prediction_check) if job.HasField("prediction_check") else None


@dataclasses.dataclass(frozen=True)
class Event:
    """One event of a job's WatchJob stream.

    kind: "snapshot" (the first: the job as it stands, in `job`), "step" (a step finished: in
    `step`), "state" (the job changed state: `state`, `reason`) or "warning" (something the job
    went on despite, such as a checkpoint the coordinator could not store: `reason`).
    """

    kind: str
    job_id: str
    state: str
    reason: str
    total_steps: int
    step: Optional[Step] = None
    job: Optional[JobStatus] = None

    @classmethod
    def from_proto(cls, e: "coordinator_pb2.JobEvent") -> "Event":
        kinds = {coordinator_pb2.JobEvent.SNAPSHOT: "snapshot", coordinator_pb2.JobEvent.STEP: "step",
                 coordinator_pb2.JobEvent.STATE: "state", coordinator_pb2.JobEvent.WARNING: "warning"}
        return cls(
            kind=kinds.get(e.kind, "unknown"), job_id=e.job_id, state=_state_name(e.state),
            reason=e.reason, total_steps=e.total_steps,
            step=Step.from_proto(e.step) if e.kind == coordinator_pb2.JobEvent.STEP else None,
            job=JobStatus.from_proto(e.job) if e.HasField("job") else None,
        )


@dataclasses.dataclass(frozen=True)
class Worker:
    """A registered stage worker (WorkerInfo)."""

    worker_id: str
    address: str
    device: str
    threads: int
    state: str                      # IDLE, BUSY, LOST
    job_id: str
    stage: int
    heartbeat_age_seconds: float
    version: str
    hostname: str
    node: str
    peak_flops: float
    device_name: str                # the GPU's, or the processor's and OpenBLAS kernels' name
    raw: Any = dataclasses.field(default=None, repr=False, compare=False)

    @classmethod
    def from_proto(cls, w) -> "Worker":
        return cls(worker_id=w.worker_id, address=w.address, device=w.device, threads=w.threads,
                   state=common_pb2.WorkerState.Name(w.state), job_id=w.job_id, stage=w.stage,
                   heartbeat_age_seconds=w.heartbeat_age_seconds, version=w.version,
                   hostname=w.hostname, node=w.node, peak_flops=w.peak_flops,
                   device_name=w.device_name, raw=w)


@dataclasses.dataclass(frozen=True)
class LayerCost:
    """One global layer's measured cost per micro-batch (LayerProfile)."""

    layer: int
    forward_seconds: float
    backward_seconds: float
    backward_input_seconds: float
    backward_weight_seconds: float
    apply_seconds: float
    parameter_count: int
    static_bytes: int
    activation_bytes: int
    output_bytes: int
    recompute_seconds: float = 0.0  # 0 where not measured: the forward's
    workspace_bytes: int = 0        # a device backend's scratch, once per stage


@dataclasses.dataclass(frozen=True)
class ModelProfile:
    """A model's measured layer costs at a spec's shape on one kind of worker (ModelProfile)."""

    key: str
    device: str
    threads: int
    device_name: str                # the profiled workers' hardware (part of the key)
    layers: Tuple[LayerCost, ...]
    link_latency_seconds: Optional[float]   # None when measured on a single worker
    link_seconds_per_byte: Optional[float]
    # What the coordinator's speed check of this cached profile found when it served it (the
    # times are already scaled when it says "priced at"); "" when served unchecked.
    speed_check: str = ""
    raw: Any = dataclasses.field(default=None, repr=False, compare=False)

    @classmethod
    def from_proto(cls, p) -> "ModelProfile":
        has_link = bool(p.link.worker_a or p.link.worker_b)
        return cls(
            key=p.key, device=p.device, threads=p.threads, device_name=p.device_name,
            layers=tuple(LayerCost(l.layer, l.forward_seconds, l.backward_seconds,
                                   l.backward_input_seconds, l.backward_weight_seconds,
                                   l.apply_seconds, l.parameter_count, l.static_bytes,
                                   l.activation_bytes, l.output_bytes, l.recompute_seconds,
                                   l.workspace_bytes) for l in p.layers),
            link_latency_seconds=p.link.latency_seconds if has_link else None,
            link_seconds_per_byte=p.link.seconds_per_byte if has_link else None,
            speed_check=p.speed_check,
            raw=p,
        )


@dataclasses.dataclass(frozen=True)
class PlanCandidate:
    """One arrangement the planner weighed (PlanCandidateInfo): P stages x R replicas, a
    schedule with its chunks, a split of the global batch, and what it predicts."""

    stages: int
    replicas: int
    schedule: str
    chunks: int
    micro_batches: int
    micro_batch_size: int
    feasible: bool
    reason: str                  # why it cannot run; "" when feasible
    step_seconds: float          # predicted
    bubble: float
    peak_stage_bytes: int        # the fullest worker's memory, its stages' together
    tokens_per_second: float
    reduce_exposed_seconds: float

    @classmethod
    def from_proto(cls, c) -> "PlanCandidate":
        return cls(c.stages, c.replicas, c.schedule, c.chunks, c.micro_batches,
                   c.micro_batch_size, c.feasible, c.reason, c.step_seconds, c.bubble,
                   c.peak_stage_bytes, c.tokens_per_second, c.reduce_exposed_seconds)


@dataclasses.dataclass(frozen=True)
class Plan:
    """The planner's search for a spec (PlanJobResponse): what `pipeline.plan: auto` would
    run (`chosen`, None when nothing fits the memory budget; `choice` says what and why) and
    every candidate it weighed, feasible and fastest first."""

    candidates: Tuple[PlanCandidate, ...]
    chosen: Optional[PlanCandidate]
    choice: str
    as_written_step_seconds: Optional[float]  # the spec as written, predicted
    # What the speed check of the cached profiles it was priced on found; "" when unchecked.
    profile_speed_check: str = ""
    raw: Any = dataclasses.field(default=None, repr=False, compare=False)

    @classmethod
    def from_proto(cls, p) -> "Plan":
        candidates = tuple(PlanCandidate.from_proto(c) for c in p.candidates)
        chosen = candidates[p.chosen] if 0 <= p.chosen < len(candidates) else None
        return cls(candidates, chosen, p.choice,
                   p.as_written_step_seconds if p.as_written_step_seconds > 0 else None,
                   p.profile_speed_check, p)

    def as_frame(self):
        """The candidates as a pandas DataFrame (pandas is optional: ImportError says so)."""
        try:
            import pandas as pd
        except ImportError as e:
            raise ImportError("Plan.as_frame() needs pandas (pip install pandas)") from e
        return pd.DataFrame([dataclasses.asdict(c) for c in self.candidates])


@dataclasses.dataclass(frozen=True)
class Export:
    """What Job.export wrote."""

    path: str                 # the safetensors file
    config_path: Optional[str]  # config.json beside it (None for a model without an HF config)
    bytes: int
    step: int                 # the checkpoint's step (0-based index)
