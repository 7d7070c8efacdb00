"""Client and Job: the coordinator's client API (tandem.v1.Coordinator) from Python.

A Client owns one gRPC channel (reused by every call and every Job it hands out); every unary
call has a deadline (`timeout`, default 10 s, as the CLI's --timeout), streams have their own.
Thread-safety: a Client may be shared between threads (gRPC channels and stubs are); a Job is a
handle (the client and the id) and holds no state of its own.
"""

import json
import os
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import grpc

from tandem import specs
from tandem._proto import PROTOCOL_VERSION, coordinator_pb2, coordinator_pb2_grpc
from tandem.errors import JobFailed, TandemError, from_rpc_error
from tandem.hf_config import hf_config_json, hf_config_path
from tandem.types import (TERMINAL_STATES, Event, Export, JobStatus, ModelProfile, Plan,
                          PredictionCheck, Step, Worker)

DEFAULT_COORDINATOR = "127.0.0.1:7070"  # coordinator/cli/args.h kDefaultCoordinator

# The environment the CLI reads (coordinator/cli/main.cc), with the same meaning.
ENV_COORDINATOR = "TANDEM_COORDINATOR"
ENV_TLS_CA = "TANDEM_TLS_CA"
ENV_TLS_CERT = "TANDEM_TLS_CERT"
ENV_TLS_KEY = "TANDEM_TLS_KEY"
ENV_TLS_SERVER_NAME = "TANDEM_TLS_SERVER_NAME"
ENV_TOKEN_FILE = "TANDEM_TOKEN_FILE"
ENV_TOKEN = "TANDEM_TOKEN"

# As common/rpc.cc's DefaultChannelArguments: large answers (a long job's history), and a dead
# coordinator noticed quickly rather than after seconds of backoff.
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


def _env(name: str) -> Optional[str]:
    value = os.environ.get(name)
    return value if value else None  # an empty variable is no default, as in the CLI


def _read_bytes(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError("%s: cannot read %s: %s" % (what, path, e.strerror)) from e


class Client:
    """A connection to a tandem-coordinator.

    Every argument left out is taken from the environment the `tandem` CLI reads, and has the
    same meaning:

      address          HOST:PORT; $TANDEM_COORDINATOR, else 127.0.0.1:7070
      tls_ca           the CA file that signs the coordinator's certificate; $TANDEM_TLS_CA.
                       Without it the channel is plaintext (for one trusted machine).
      cert             a client certificate (CN=tandem-client): a (cert_file, key_file) pair,
                       or the cert file with `key`; $TANDEM_TLS_CERT and $TANDEM_TLS_KEY
      token            the bearer token itself; else token_file ($TANDEM_TOKEN_FILE), else
                       $TANDEM_TOKEN. Sent only over TLS: a token without tls_ca is ValueError.
      tls_server_name  the name the coordinator's certificate carries, if not the host dialled;
                       $TANDEM_TLS_SERVER_NAME
      timeout          the deadline of each unary call, in seconds (the CLI's --timeout)
    """

    def __init__(self, address: Optional[str] = None, *, tls_ca: Optional[str] = None,
                 token: Optional[str] = None, cert: Union[None, str, Tuple[str, str]] = None,
                 key: Optional[str] = None, token_file: Optional[str] = None,
                 tls_server_name: Optional[str] = None, timeout: float = 10.0):
        self.address = address or _env(ENV_COORDINATOR) or DEFAULT_COORDINATOR
        if not self.address or any(c.isspace() for c in self.address):
            raise ValueError("address: expected HOST:PORT, got %r" % self.address)
        if timeout <= 0:
            raise ValueError("timeout: expected a number of seconds > 0, got %r" % timeout)
        self.timeout = float(timeout)
        tls_ca = tls_ca or _env(ENV_TLS_CA)
        if isinstance(cert, (tuple, list)):
            if len(cert) != 2 or key is not None:
                raise ValueError("cert: give (cert_file, key_file), or cert_file with key=")
            cert, key = cert
        cert = cert or _env(ENV_TLS_CERT)
        key = key or _env(ENV_TLS_KEY)
        tls_server_name = tls_server_name or _env(ENV_TLS_SERVER_NAME)
        if token is None:
            token_file = token_file or _env(ENV_TOKEN_FILE)
            if token_file:
                token = _read_bytes(token_file, "token_file").decode("utf-8", "replace")
            else:
                token = _env(ENV_TOKEN)
        token = token.strip() if token else None
        if bool(cert) != bool(key):
            raise ValueError("a client certificate needs both its files: cert and key "
                             "($TANDEM_TLS_CERT and $TANDEM_TLS_KEY)")
        if (cert or tls_server_name) and not tls_ca:
            raise ValueError("cert and tls_server_name are TLS settings: give tls_ca (or "
                             "$TANDEM_TLS_CA) too")
        if token and not tls_ca:
            raise ValueError("a bearer token (token, token_file, $TANDEM_TOKEN_FILE, "
                             "$TANDEM_TOKEN) is sent only over TLS: give tls_ca (or $TANDEM_TLS_CA)")
        self.tls = bool(tls_ca)
        options = list(_CHANNEL_OPTIONS)
        if tls_ca:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read_bytes(tls_ca, "tls_ca"),
                private_key=_read_bytes(key, "key") if key else None,
                certificate_chain=_read_bytes(cert, "cert") if cert else None)
            if token:
                credentials = grpc.composite_channel_credentials(
                    credentials, grpc.access_token_call_credentials(token))
            if tls_server_name:
                options.append(("grpc.ssl_target_name_override", tls_server_name))
            self._channel = grpc.secure_channel(self.address, credentials, options=options)
        else:
            self._channel = grpc.insecure_channel(self.address, options=options)
        self._stub = coordinator_pb2_grpc.CoordinatorStub(self._channel)

    # --- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        """Closes the channel; the client and its jobs cannot call after this."""
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return "Client(%r%s)" % (self.address, ", tls" if self.tls else "")

    # --- calls -----------------------------------------------------------------------------

    def _call(self, method: str, request, *, spec: bool = False, timeout: Optional[float] = None):
        request.protocol_version = PROTOCOL_VERSION
        try:
            return getattr(self._stub, method)(request, timeout=timeout or self.timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e, method, self.address, spec=spec) from None

    def submit(self, spec: specs.SpecLike) -> "Job":
        """Submits a job; returns its Job (QUEUED until the gang of workers is free).

        spec: a YAML file's path (str or pathlib.Path), YAML text, a dict of JobSpec's fields
        ({"model": {"preset": "gpt2-tiny"}, "steps": 20, ...}), or a tandem.v1.JobSpec. The
        coordinator validates it: SpecError (INVALID_ARGUMENT) lists every error with its field
        path in `field_errors` (and its line in the text sent: a dict is sent as indented JSON).
        """
        kind, value = specs.spec_source(spec)
        request = coordinator_pb2.SubmitJobRequest()
        if kind == "spec":
            request.spec.CopyFrom(value)
        else:
            request.spec_yaml = value
        response = self._call("SubmitJob", request, spec=True)
        return Job(self, response.job_id)

    def job(self, job_id: str) -> "Job":
        """The Job of an id (no call is made; a wrong id fails on first use with NOT_FOUND)."""
        return Job(self, job_id)

    def jobs(self) -> List[JobStatus]:
        """Every job the coordinator holds, oldest first, without step history."""
        response = self._call("ListJobs", coordinator_pb2.ListJobsRequest())
        return [JobStatus.from_proto(j) for j in response.jobs]

    def workers(self) -> List[Worker]:
        """The registered workers: device, state, job and stage, heartbeat age."""
        response = self._call("ListWorkers", coordinator_pb2.ListWorkersRequest())
        return [Worker.from_proto(w) for w in response.workers]

    def worker(self, worker_id: str) -> Worker:
        """One worker; NOT_FOUND lists the registered ids."""
        return Worker.from_proto(
            self._call("GetWorker", coordinator_pb2.GetWorkerRequest(worker_id=worker_id)))

    def profile(self, spec: specs.SpecLike, refresh: bool = False,
                timeout: float = 600.0) -> ModelProfile:
        """The measured per-layer costs of the spec's model at its micro-batch shape, on a
        worker of its device kind (ProfileModel): cached by the coordinator, or measured on an
        idle worker (which may take a while: `timeout`). This is what `tandem plan` and
        Client.plan plan with.

        A dict or JobSpec works as is; YAML text or a file needs PyYAML (the call takes a
        message, not text). SpecError when the coordinator rejects the spec.
        """
        request = coordinator_pb2.ProfileModelRequest(refresh=refresh)
        request.spec.CopyFrom(specs.to_message(spec))
        return ModelProfile.from_proto(self._call("ProfileModel", request, spec=True,
                                                  timeout=timeout))

    def plan(self, spec: specs.SpecLike, timeout: float = 600.0) -> Plan:
        """The planner's search for the spec (PlanJob), as `pipeline.plan: auto` runs it at
        submit, with nothing submitted: every (stages x replicas, schedule, chunks, split of the
        global batch) candidate with its predicted step, bubble and memory, fastest feasible
        first, and the one it would run (`Plan.chosen`, None when nothing fits the memory
        budget; `Plan.choice` says why). Profiles are measured on idle workers or cached, as
        for profile() (`timeout`). A dict or JobSpec works as is; YAML text or a file needs
        PyYAML. SpecError when the coordinator rejects the spec.
        """
        request = coordinator_pb2.PlanJobRequest()
        request.spec.CopyFrom(specs.to_message(spec))
        return Plan.from_proto(self._call("PlanJob", request, spec=True, timeout=timeout))

    # The raw calls Job uses.

    def _get_job(self, job_id: str, history_limit: int = 0,
                 after_step: Optional[int] = None) -> "coordinator_pb2.Job":
        request = coordinator_pb2.GetJobRequest(job_id=job_id, history_limit=history_limit)
        if after_step is not None:
            request.history_after_step = after_step
        return self._call("GetJob", request)


class Job:
    """A handle on one job of a coordinator: status, watch, history, cancel, trace, export.

    It holds only the client and the id: every method asks the coordinator.
    """

    def __init__(self, client: Client, job_id: str):
        self.client = client
        self.id = job_id

    def __repr__(self) -> str:
        return "Job(%r)" % self.id

    def __eq__(self, other) -> bool:
        return isinstance(other, Job) and other.id == self.id and other.client is self.client

    def __hash__(self) -> int:
        return hash(self.id)

    def status(self) -> JobStatus:
        """The job as it stands (state, reason, progress, losses, stages, spec)."""
        return JobStatus.from_proto(self.client._get_job(self.id, history_limit=1))

    @property
    def state(self) -> str:
        """QUEUED, RUNNING, SUCCEEDED, FAILED or CANCELLED (one call)."""
        return self.status().state

    def cancel(self) -> JobStatus:
        """Stops a queued or running job (its workers are aborted and released) and returns
        the job as it then stands: CANCELLED at once when it was queued; a running job stays
        RUNNING until its runner has stopped, within moments (wait() or watch() see it end).
        TandemError FAILED_PRECONDITION when the job has already ended."""
        return JobStatus.from_proto(self.client._call(
            "CancelJob", coordinator_pb2.CancelJobRequest(job_id=self.id)))

    def history(self, as_frame: bool = False, after_step: Optional[int] = None):
        """Every retained step summary, in step order, as Step dataclasses; with as_frame=True a
        pandas DataFrame (one row per step, the scalar fields as columns, val_loss NaN where
        no validation ran, indexed by step). after_step: only the steps after that index."""
        job = self.client._get_job(self.id, history_limit=0, after_step=after_step)
        steps = [Step.from_proto(s) for s in job.history]
        return to_frame(steps) if as_frame else steps

    def prediction_check(self, recent: int = 10) -> Optional[PredictionCheck]:
        """The last `recent` steps (0: every retained one) against the predicted step, and
        whose miss a miss is (PredictionCheck.miss), as `tandem status` says under "Measured";
        None without a prediction or two steady steps."""
        job = self.client._get_job(self.id, history_limit=max(0, recent))
        return PredictionCheck.of(job)

    def watch(self, progress: bool = False, timeout: Optional[float] = None) -> Iterator[Event]:
        """Follows the job: yields every Event of its WatchJob stream (a snapshot first, then
        one per step and per state change) and returns once the job has ended.

        progress: show a tqdm progress bar (the loss as its postfix) while watching; needs
        tqdm installed. timeout: give up after this many seconds (DEADLINE_EXCEEDED); None
        waits as long as the job runs (the CLI's watch waits up to a week).
        TandemError UNAVAILABLE when the stream ends before the job does (watch again to resume).
        """
        bar = _progress_bar(self.id) if progress else None
        request = coordinator_pb2.WatchJobRequest(job_id=self.id,
                                                  protocol_version=PROTOCOL_VERSION)
        stream = self.client._stub.WatchJob(request, timeout=timeout or 7 * 24 * 3600.0)
        state = None
        try:
            for message in stream:
                event = Event.from_proto(message)
                state = event.state
                if bar is not None:
                    _update_bar(bar, event)
                yield event
                if state in TERMINAL_STATES:
                    return
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.CANCELLED and state in TERMINAL_STATES:
                return
            raise from_rpc_error(e, "WatchJob", self.client.address) from None
        finally:
            stream.cancel()  # the consumer stopped early, or the job ended: release the stream
            if bar is not None:
                bar.close()
        raise TandemError(grpc.StatusCode.UNAVAILABLE,
                          "the coordinator at %s ended the stream while job %s was %s; watch "
                          "again to resume" % (self.client.address, self.id, state))

    def wait(self, timeout: Optional[float] = None, progress: bool = False,
             raise_on_failure: bool = True) -> JobStatus:
        """Watches the job until it ends; returns its final status. JobFailed (code ABORTED) if
        it FAILED or was CANCELLED, unless raise_on_failure=False."""
        for _ in self.watch(progress=progress, timeout=timeout):
            pass
        status = self.status()
        if raise_on_failure and status.state in ("FAILED", "CANCELLED"):
            raise JobFailed("job %s %s: %s" % (self.id, status.state,
                                               status.reason or "no reason given"), status)
        return status

    def trace(self, step: Optional[int] = None, *, steps: Optional[Tuple[int, int]] = None,
              svg: bool = False, path: Optional[str] = None) -> Union[Dict[str, Any], str]:
        """The measured timeline of a kept step (GetJobTrace), as `tandem trace` writes it.

        step: the step's 0-based index, as in history() (default: the latest kept step);
        steps=(first, last): every kept step in that range, end to end (JSON only). Returns the
        Chrome trace-event JSON (open it in ui.perfetto.dev) parsed into a dict, or with
        svg=True the SVG Gantt chart's text. path: also write the document there.
        NOT_FOUND names the steps the coordinator keeps.
        """
        if step is not None and steps is not None:
            raise ValueError("give step or steps, not both")
        if svg and steps is not None:
            raise ValueError("svg draws one step: give step (or none for the latest)")
        request = coordinator_pb2.GetJobTraceRequest(
            job_id=self.id,
            format=coordinator_pb2.TRACE_FORMAT_SVG if svg else coordinator_pb2.TRACE_FORMAT_JSON)
        if step is not None:
            request.step = step
        if steps is not None:
            request.first_step, request.last_step = steps
        response = self.client._call("GetJobTrace", request)
        if path is not None:
            _write_atomically(path, response.content)
        text = response.content.decode("utf-8")
        return text if svg else json.loads(text)

    def export(self, path: str, timeout: float = 3600.0) -> Export:
        """Writes the job's latest checkpoint as a Hugging Face safetensors file at `path`
        (GPT2LMHeadModel for gpt, LlamaForCausalLM for llama) and config.json in its directory,
        as `tandem export -o path` does (name it model.safetensors for from_pretrained(dir)).
        The file is written through path + ".tmp" and a rename: never a torn file."""
        job = self.client._get_job(self.id, history_limit=1)  # NOT_FOUND before any writing
        config = hf_config_json(_model_dict(job))
        tmp = path + ".tmp"
        request = coordinator_pb2.ExportModelRequest(job_id=self.id,
                                                     protocol_version=PROTOCOL_VERSION)
        written, total, step = 0, -1, -1
        stream = self.client._stub.ExportModel(request, timeout=timeout)
        try:
            with open(tmp, "wb") as out:
                for chunk in stream:
                    if total < 0:
                        total, step = chunk.total_bytes, chunk.step
                        # The first chunk says how much follows: a disk that cannot hold it is
                        # refused now, as `tandem export` does, not at the stream's end.
                        _check_free_space(tmp, total)
                    out.write(chunk.data)
                    written += len(chunk.data)
        except grpc.RpcError as e:
            _remove(tmp)
            raise from_rpc_error(e, "ExportModel", self.client.address) from None
        except BaseException:
            stream.cancel()
            _remove(tmp)
            raise
        if written != total:
            _remove(tmp)
            raise TandemError(grpc.StatusCode.DATA_LOSS,
                              "export: received %d of %d bytes; try again" % (written, total))
        os.replace(tmp, path)
        config_path = None
        if config is not None:
            config_path = hf_config_path(path)
            _write_atomically(config_path, config.encode("utf-8"))
        return Export(path=path, config_path=config_path, bytes=written, step=step)

    def plot(self, ax=None):
        """Draws the loss and the validation loss against the step with matplotlib (an
        ImportError says how to install it); returns the Axes."""
        try:
            import matplotlib.pyplot as plt
        except ImportError as e:
            raise ImportError("Job.plot needs matplotlib (pip install matplotlib); "
                              "_repr_html_ draws the curve without it") from e
        steps = self.history()
        if ax is None:
            _, ax = plt.subplots()
        ax.plot([s.step for s in steps], [s.loss for s in steps], label="loss")
        val = [s for s in steps if s.val_loss is not None]
        if val:
            ax.plot([s.step for s in val], [s.val_loss for s in val], "o-", label="validation loss")
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.set_title(self.id)
        ax.legend()
        return ax

    def _repr_html_(self) -> str:
        from tandem._html import job_html

        try:
            job = self.client._get_job(self.id, history_limit=0)
        except TandemError as e:
            import html

            return "<div>%s: %s</div>" % (html.escape(self.id), html.escape(str(e)))
        return job_html(JobStatus.from_proto(job), [Step.from_proto(s) for s in job.history])


# --- helpers ---------------------------------------------------------------------------------

FRAME_COLUMNS = ("step", "loss", "val_loss", "step_seconds", "tokens_per_second", "grad_norm",
                 "learning_rate", "skipped", "bubble_measured", "bubble_predicted", "mfu",
                 "coordinator_overhead_seconds", "max_worker_exec_seconds",
                 "max_worker_update_seconds", "bytes_sent", "peak_activation_bytes",
                 "reduced_bytes")


def to_frame(steps: Sequence[Step]):
    """Steps as a pandas DataFrame indexed by step (pandas is optional: ImportError says so)."""
    try:
        import pandas as pd
    except ImportError as e:
        raise ImportError("history(as_frame=True) needs pandas (pip install pandas)") from e
    rows = [{c: (float("nan") if c == "val_loss" and s.val_loss is None else getattr(s, c))
             for c in FRAME_COLUMNS} for s in steps]
    return pd.DataFrame(rows, columns=list(FRAME_COLUMNS)).set_index("step")


def _model_dict(job) -> Dict[str, Any]:
    from tandem.types import message_to_dict

    return message_to_dict(job.spec.model)


def _progress_bar(job_id: str):
    try:
        from tqdm.auto import tqdm
    except ImportError as e:
        raise ImportError("watch(progress=True) needs tqdm (pip install tqdm)") from e
    return tqdm(desc=job_id, unit="step", total=None)


def _update_bar(bar, event: Event) -> None:
    if event.total_steps and bar.total != event.total_steps:
        bar.total = event.total_steps
        bar.refresh()
    if event.kind == "snapshot" and event.job is not None:
        bar.update(event.job.steps_done - bar.n)
    elif event.kind == "step" and event.step is not None:
        bar.update(event.step.step + 1 - bar.n)
        bar.set_postfix(loss="%.4f" % event.step.loss)
    elif event.kind == "state":
        bar.set_description("%s %s" % (event.job_id, event.state))
    elif event.kind == "warning":
        bar.write("%s warning: %s" % (event.job_id, event.reason))


def _write_atomically(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise


def _check_free_space(path: str, size: int) -> None:
    """TandemError RESOURCE_EXHAUSTED, naming both sizes, when the file system of `path` has
    fewer than `size` bytes available to this user."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        st = os.statvfs(directory)
    except OSError:
        return  # it cannot say: the writes fail as they would
    free = st.f_bavail * st.f_frsize
    if size > free:
        raise TandemError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          "export: the model is %d bytes and %s has %d free; free some space or "
                          "export elsewhere" % (size, directory, free))


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
