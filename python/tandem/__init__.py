"""tandem: the Python client of Tandem, the pipeline-parallel training service.

    import tandem
    client = tandem.Client()                  # $TANDEM_COORDINATOR, TLS from $TANDEM_TLS_CA...
    job = client.submit("examples/quickstart.yaml")   # or YAML text, or a dict
    for event in job.watch(progress=True):
        ...
    job.history(as_frame=True)                # pandas, if installed

It speaks the coordinator's gRPC API (proto/tandem/v1/coordinator.proto), whose Python modules
are generated from the protos when the package is built (`pip install ./python`).
"""

from tandem.client import DEFAULT_COORDINATOR, Client, Job, to_frame
from tandem.errors import FieldError, JobFailed, SpecError, TandemError
from tandem.hf_config import hf_config, hf_config_json
from tandem.types import (Event, Export, JobStatus, LayerCost, ModelProfile, Plan, PlanCandidate,
                          PredictionCheck, Stage, Step, Worker)

__version__ = "0.1.0"

__all__ = [
    "Client", "Job", "DEFAULT_COORDINATOR", "to_frame",
    "TandemError", "SpecError", "JobFailed", "FieldError",
    "JobStatus", "Step", "Stage", "Event", "Worker", "ModelProfile", "LayerCost", "Export",
    "Plan", "PlanCandidate", "PredictionCheck",
    "hf_config", "hf_config_json",
]
