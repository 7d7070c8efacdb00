"""Job specs as the client takes them: a YAML file, YAML text, a dict, or a JobSpec message.

The coordinator parses and validates specs itself (SubmitJobRequest.spec_yaml), so a YAML file
or text is sent as it is and its errors come back with the field's path and line. A dict is
sent as JSON, which is YAML, so no YAML library is needed; its keys are the field names of
tandem.v1.JobSpec (proto/tandem/v1/spec.proto), nested as in a YAML file.
"""

import json
import os
from typing import Any, Mapping, Union

from tandem._proto import spec_pb2

SpecLike = Union[str, "os.PathLike[str]", Mapping[str, Any], "spec_pb2.JobSpec"]

_YAML_SUFFIXES = (".yaml", ".yml", ".json")


def _looks_like_path(text: str) -> bool:
    return "\n" not in text and (text.endswith(_YAML_SUFFIXES) or os.path.isfile(text))


def spec_source(spec: SpecLike):
    """What to send for `spec`: ("spec_yaml", text) or ("spec", JobSpec).

    A str is a file's path when it is one line that names an existing file or ends in .yaml,
    .yml or .json (a missing file is FileNotFoundError); otherwise YAML text. A pathlib.Path is
    always a file. ValueError for a dict that JSON cannot hold (NaN, infinity, other types).
    """
    if isinstance(spec, spec_pb2.JobSpec):
        return "spec", spec
    if isinstance(spec, os.PathLike):
        return "spec_yaml", _read(os.fspath(spec))
    if isinstance(spec, str):
        if _looks_like_path(spec.strip()):
            return "spec_yaml", _read(spec.strip())
        return "spec_yaml", spec
    if isinstance(spec, Mapping):
        return "spec_yaml", to_json(spec)
    raise TypeError("a job spec is a YAML file's path, YAML text, a dict or a tandem.v1.JobSpec; "
                    "got %s" % type(spec).__name__)


def to_json(spec: Mapping[str, Any]) -> str:
    """A dict spec as JSON text (JSON is YAML): what submit() sends for a dict."""
    try:
        return json.dumps(spec, indent=1, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError("the job spec dict cannot be sent as JSON: %s" % e) from e


def to_message(spec: SpecLike) -> "spec_pb2.JobSpec":
    """`spec` as a JobSpec message, for the calls that take one (profile()).

    A dict is converted by protobuf's JSON parser (unknown fields are ValueError); YAML text or
    a file needs PyYAML (pip install PyYAML), since the coordinator has no call that parses
    YAML without submitting it.
    """
    from google.protobuf import json_format

    kind, value = spec_source(spec)
    if kind == "spec":
        return value
    if isinstance(spec, Mapping):
        data = spec
    else:
        try:
            import yaml
        except ImportError as e:
            raise ImportError("a YAML job spec needs PyYAML here (pip install PyYAML), or pass "
                              "the spec as a dict") from e
        data = yaml.safe_load(value)
        if not isinstance(data, Mapping):
            raise ValueError("a job spec is a YAML mapping of JobSpec's fields")
    message = spec_pb2.JobSpec()
    try:
        json_format.ParseDict(dict(data), message)
    except json_format.ParseError as e:
        raise ValueError("job spec: %s" % e) from e
    return message


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()
