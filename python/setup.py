"""Build of tandem-client: generates the protobuf and gRPC modules from ../proto at build time.

The generated code is never committed. `build_py` compiles proto/tandem/v1/{spec,common,
coordinator}.proto into the build tree as the subpackage `tandem.v1` (the protos' own package,
so the generated `from tandem.v1 import spec_pb2` imports resolve inside this package), with the
first generator that compiles them:

  1. grpcio-tools (`python -m grpc_tools.protoc`), the usual tool, which pip installs into an
     isolated build environment from pyproject.toml's build requirements;
  2. `protoc` with `grpc_python_plugin` on PATH (Debian: protobuf-compiler and
     protobuf-compiler-grpc, which Tandem's C++ build needs anyway).

The second exists because Debian 12's python3-grpc-tools is grpcio-tools 1.14.1, whose bundled
protoc predates proto3 `optional` (coordinator.proto uses it) and fails; an offline build
(`pip install --no-build-isolation`, as the ctest entry does) then uses the system protoc.

Generated code and the runtime must agree: newer generators stamp their version into the code
(`# Protobuf Python Version: X.Y.Z`, `GRPC_GENERATED_VERSION = 'X.Y.Z'`) and refuse an older
runtime at import. The install requirements are read from the code generated here, so pip
installs a runtime at least that new.

TANDEM_PROTO_DIR overrides where the .proto files are (default: ../proto beside this file).
"""

import atexit
import os
import re
import shutil
import subprocess
import sys
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTOS = ("tandem/v1/spec.proto", "tandem/v1/common.proto", "tandem/v1/coordinator.proto")
GENERATED_PACKAGE = ("tandem", "v1")


def proto_root():
    candidates = [os.environ.get("TANDEM_PROTO_DIR", ""), os.path.join(HERE, "..", "proto")]
    for root in candidates:
        if root and all(os.path.isfile(os.path.join(root, p)) for p in PROTOS):
            return os.path.abspath(root)
    raise SystemExit("tandem-client: cannot find %s under %s; build from a Tandem checkout "
                     "(pip install ./python) or set TANDEM_PROTO_DIR"
                     % (", ".join(PROTOS), " or ".join(c for c in candidates if c)))


def _grpc_tools_command(root, out):
    try:
        import grpc_tools  # noqa: F401  (only to know it is there)
        from importlib import resources

        include = str(resources.files("grpc_tools") / "_proto")
    except Exception as e:  # not installed, or too old for importlib.resources
        return None, "grpcio-tools is not installed (%s)" % e
    return [sys.executable, "-m", "grpc_tools.protoc", "-I" + root, "-I" + include,
            "--python_out=" + out, "--grpc_python_out=" + out] + list(PROTOS), None


def _protoc_command(root, out):
    protoc = shutil.which("protoc")
    plugin = shutil.which("grpc_python_plugin")
    if protoc is None or plugin is None:
        return None, "protoc and grpc_python_plugin are not both on PATH"
    return [protoc, "--plugin=protoc-gen-grpc_python=" + plugin, "-I" + root,
            "--python_out=" + out, "--grpc_python_out=" + out] + list(PROTOS), None


GENERATORS = (("grpcio-tools", _grpc_tools_command), ("protoc + grpc_python_plugin", _protoc_command))

_generated = {}  # memo: the directory holding the generated tree, and what made it


def generate():
    """Compiles the protos once per build into a temporary tree; returns (dir, generator name)."""
    if _generated:
        return _generated["dir"], _generated["by"]
    root = proto_root()
    failures = []
    for name, command in GENERATORS:
        out = tempfile.mkdtemp(prefix="tandem-client-gen-")
        argv, why = command(root, out)
        if argv is None:
            failures.append("%s: %s" % (name, why))
            shutil.rmtree(out)
            continue
        run = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        if run.returncode == 0:
            atexit.register(shutil.rmtree, out, True)
            _generated.update(dir=out, by=name)
            return out, name
        failures.append("%s: exit %d: %s" % (name, run.returncode, run.stderr.strip()[:2000]))
        shutil.rmtree(out)
    raise SystemExit("tandem-client: could not generate the protobuf code from %s:\n  %s\n"
                     "Install grpcio-tools (pip install grpcio-tools), or protoc and "
                     "grpc_python_plugin (Debian: apt-get install protobuf-compiler "
                     "protobuf-compiler-grpc)." % (root, "\n  ".join(failures)))


def _stamped_version(path, pattern):
    try:
        with open(path, encoding="utf-8") as f:
            m = re.search(pattern, f.read())
    except OSError:
        return None
    return m.group(1) if m else None


def runtime_requirements():
    """grpcio and protobuf, at least as new as the generated code says it needs."""
    out, _ = generate()
    gen = os.path.join(out, *GENERATED_PACKAGE)
    protobuf = _stamped_version(os.path.join(gen, "coordinator_pb2.py"),
                                r"# Protobuf Python Version: (\d+\.\d+\.\d+)")
    grpcio = _stamped_version(os.path.join(gen, "coordinator_pb2_grpc.py"),
                              r"GRPC_GENERATED_VERSION = '(\d+\.\d+\.\d+)'")
    # 3.20: the generated code's builder API; 1.51: Debian 12's grpcio.
    return ["grpcio>=" + (grpcio or "1.51"), "protobuf>=" + (protobuf or "3.20")]


class BuildPyWithProtos(build_py):
    """build_py, then the generated modules into the build tree as tandem/v1/."""

    def run(self):
        super().run()
        out, by = generate()
        target = os.path.join(self.build_lib, *GENERATED_PACKAGE)
        if os.path.isdir(target):
            shutil.rmtree(target)
        shutil.copytree(os.path.join(out, *GENERATED_PACKAGE), target)
        with open(os.path.join(target, "__init__.py"), "w", encoding="utf-8") as f:
            f.write('"""Generated at build time from proto/tandem/v1 (never committed)."""\n'
                    "GENERATOR = %r\n" % by)
        self.announce("tandem-client: generated tandem.v1 with %s" % by, level=2)


setup(
    install_requires=runtime_requirements(),
    cmdclass={"build_py": BuildPyWithProtos},
)
