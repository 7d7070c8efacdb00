"""The generated protobuf and gRPC modules (tandem.v1), built from proto/ at install time."""

try:
    from tandem.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc, spec_pb2
except ImportError as e:  # a source checkout on sys.path, not the installed package
    raise ImportError(
        "tandem: the generated protobuf modules (tandem.v1) are missing: they are built when the "
        "package is installed, never committed. Install it with `pip install ./python` from a "
        "Tandem checkout (and do not run Python from inside python/, where the source tree "
        "shadows the installed package). Cause: %s" % e
    ) from e

# Every request carries it; the coordinator refuses a version it does not speak.
PROTOCOL_VERSION = common_pb2.PROTOCOL_VERSION_CURRENT

__all__ = ["common_pb2", "coordinator_pb2", "coordinator_pb2_grpc", "spec_pb2", "PROTOCOL_VERSION"]
