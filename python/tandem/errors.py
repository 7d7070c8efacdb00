"""Errors: every failed call raises a TandemError carrying the gRPC status code and the
coordinator's message; a rejected job spec also carries each error's field path."""

import dataclasses
from typing import Optional, Tuple

import grpc


@dataclasses.dataclass(frozen=True)
class FieldError:
    """One error of a job spec, as the coordinator reports it (common/field_errors.h).

    path: the field ("pipeline.micro_batches", "pipeline.cuts[1]"), a section ("model"), or
    "job spec" for the text as a whole; empty when the line names none. line and column are
    1-based places in the YAML text sent (0 where unknown).
    """

    path: str
    message: str
    line: int = 0
    column: int = 0

    def __str__(self):
        place = ""
        if self.line > 0:
            place = " (line %d%s)" % (self.line, ", column %d" % self.column if self.column > 0 else "")
        return "%s%s%s%s" % (self.path, ": " if self.path else "", self.message, place)


class TandemError(Exception):
    """A call to the coordinator failed.

    code: the grpc.StatusCode (INVALID_ARGUMENT, NOT_FOUND, UNAVAILABLE, UNAUTHENTICATED, ...).
    message: the coordinator's message (or the client's, for a failure on this side).
    field_errors: for a rejected job spec, each error with its field path; else empty.
    """

    def __init__(self, code: grpc.StatusCode, message: str,
                 field_errors: Tuple[FieldError, ...] = ()):
        self.code = code
        self.message = message
        self.field_errors = tuple(field_errors)
        super().__init__("%s: %s" % (code.name, message))

    @property
    def paths(self) -> Tuple[str, ...]:
        """The field paths of field_errors, in the order reported."""
        return tuple(e.path for e in self.field_errors)


class SpecError(TandemError):
    """The coordinator rejected a job spec (INVALID_ARGUMENT); field_errors lists every error."""


class JobFailed(TandemError):
    """A job waited for ended FAILED or CANCELLED (code ABORTED, as `tandem watch` exits 1).

    job: the JobStatus it ended with.
    """

    def __init__(self, message: str, job):
        super().__init__(grpc.StatusCode.ABORTED, message)
        self.job = job


def _strip_place(line: str):
    """Splits a trailing " (line L[, column C])" off `line` (FieldErrors' Place)."""
    if not line.endswith(")"):
        return line, 0, 0
    open_at = line.rfind(" (line ")
    if open_at < 0:
        return line, 0, 0
    inside = line[open_at + 7:-1]
    line_no, _, column = inside.partition(", column ")
    try:
        l = int(line_no)
        c = int(column) if column else 0
    except ValueError:
        return line, 0, 0
    if l <= 0 or (column and c <= 0):
        return line, 0, 0
    return line[:open_at], l, c


def _path_end(line: str) -> int:
    """Where "<path>: " ends, looking past ": " inside [brackets]; -1 if there is none."""
    depth = 0
    for i in range(len(line) - 1):
        ch = line[i]
        if ch == "[":
            depth += 1
        elif ch == "]" and depth > 0:
            depth -= 1
        elif depth == 0 and ch == ":" and line[i + 1] == " ":
            return i
    return -1


def parse_field_errors(text: str, max_errors: int = 50) -> Tuple[FieldError, ...]:
    """The text form of common/field_errors.h read back (its ParseFieldErrors, in Python):
    one error per line, lines starting with two spaces continue the error above."""
    out = []
    for raw in text.split("\n"):
        line = raw[:-1] if raw.endswith("\r") else raw
        if line.startswith("  ") and out:
            prev = out[-1]
            out[-1] = dataclasses.replace(prev, message=prev.message + "\n" + line)
            continue
        if not line.strip():
            continue
        if len(out) >= max_errors:
            break
        line, l, c = _strip_place(line)
        end = _path_end(line)
        if end > 0:
            out.append(FieldError(line[:end], line[end + 2:], l, c))
        else:
            out.append(FieldError("", line, l, c))
    return tuple(out)


def from_rpc_error(e: grpc.RpcError, what: str, address: Optional[str] = None,
                   spec: bool = False) -> TandemError:
    """A grpc.RpcError as a TandemError; `spec`: an INVALID_ARGUMENT is about a job spec."""
    code = e.code() if callable(getattr(e, "code", None)) else grpc.StatusCode.UNKNOWN
    message = e.details() if callable(getattr(e, "details", None)) else str(e)
    message = message or ""
    if code == grpc.StatusCode.INVALID_ARGUMENT and spec:
        return SpecError(code, message, parse_field_errors(message))
    if code == grpc.StatusCode.UNAVAILABLE and address:
        message = "%s: cannot reach the coordinator at %s: %s" % (what, address, message)
    return TandemError(code, message)
