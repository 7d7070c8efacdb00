"""Fixtures: a real tandem-coordinator and two real CPU tandem-workers on 127.0.0.1.

The binaries come from $TANDEM_BIN_DIR (default: build/bin of the checkout); the tests that
need them skip when they are missing. Ports are ephemeral (--listen 127.0.0.1:0, read back from
--port-file), so runs do not collide. Every wait is bounded in time; every process is killed
at teardown, and its log printed when the cluster failed to come up.
"""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("TANDEM_BIN_DIR") or os.path.join(REPO, "build", "bin")

# A job that takes well under a second on two CPU workers: a 2-layer GPT on synthetic bytes.
TINY_STEPS = 6


def tiny_spec(name="tiny", steps=TINY_STEPS, **overrides):
    spec = {
        "name": name,
        "steps": steps,
        "model": {"preset": "gpt2-tiny"},
        "pipeline": {"stages": 2, "micro_batch_size": 2, "micro_batches": 2,
                     "partition": "uniform"},
        "eval": {"every": 3, "micro_batches": 1},
    }
    for key, value in overrides.items():
        if isinstance(value, dict):
            spec.setdefault(key, {}).update(value)
        else:
            spec[key] = value
    return spec


def binary(name):
    path = os.path.join(BIN, name)
    if not os.access(path, os.X_OK):
        pytest.skip("%s is not built (set TANDEM_BIN_DIR, or build it)" % path)
    return path


def _wait_for(predicate, seconds, what):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise TimeoutError("%s: not within %.0f s" % (what, seconds))


class Cluster:
    """A coordinator and `workers` CPU workers, optionally with TLS (certs: a dev-certs dir)."""

    def __init__(self, root, workers=2, certs=None):
        self.root = root
        self.certs = certs
        self.procs = []
        self.logs = []
        self.address = None
        self._start(workers)

    def _spawn(self, name, argv):
        log = open(os.path.join(self.root, name + ".log"), "wb")
        self.logs.append(log.name)
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self.procs.append(proc)
        return proc

    def _start(self, workers):
        port_file = os.path.join(self.root, "coordinator.port")
        argv = [binary("tandem-coordinator"), "--listen=127.0.0.1:0", "--port-file=" + port_file,
                "--data-root=" + os.path.join(self.root, "coordinator"),
                "--heartbeat-ms=200", "--worker-timeout-ms=3000", "--rpc-nice=0"]
        if self.certs:
            argv += ["--tls-cert=%s/coordinator.crt" % self.certs,
                     "--tls-key=%s/coordinator.key" % self.certs,
                     "--tls-ca=%s/ca.crt" % self.certs,
                     "--auth-token-file=%s/token" % self.certs]
        coordinator = self._spawn("coordinator", argv)

        def port():
            if coordinator.poll() is not None:
                raise RuntimeError("tandem-coordinator exited with %s" % coordinator.returncode)
            try:
                with open(port_file) as f:
                    return f.read().strip()
            except OSError:
                return None

        try:
            self.address = "127.0.0.1:" + _wait_for(port, 15, "the coordinator's port file")
            data = os.path.join(self.root, "worker-data")
            os.makedirs(data, exist_ok=True)
            for i in range(workers):
                argv = [binary("tandem-worker"), "--coordinator=" + self.address,
                        "--listen=127.0.0.1:0", "--device=cpu", "--threads=1",
                        "--heartbeat-ms=200", "--data-root=" + data]
                if self.certs:
                    argv += ["--tls-cert=%s/worker.crt" % self.certs,
                             "--tls-key=%s/worker.key" % self.certs,
                             "--tls-ca=%s/ca.crt" % self.certs]
                self._spawn("worker%d" % i, argv)
            client = self.client()
            try:
                _wait_for(lambda: sum(w.state == "IDLE" for w in client.workers()) >= workers,
                          60, "%d idle workers" % workers)
            finally:
                client.close()
        except BaseException:
            self.dump_logs()
            self.stop()
            raise

    def client(self, **kwargs):
        import tandem

        if self.certs and "tls_ca" not in kwargs:
            kwargs = dict(tls_ca=os.path.join(self.certs, "ca.crt"),
                          token_file=os.path.join(self.certs, "token"), **kwargs)
        return tandem.Client(self.address, **kwargs)

    def cli(self, *args, timeout=60):
        """Runs build/bin/tandem against this coordinator; returns its stdout."""
        argv = [binary("tandem"), "--coordinator", self.address]
        if self.certs:
            argv += ["--tls-ca", os.path.join(self.certs, "ca.crt"),
                     "--token-file", os.path.join(self.certs, "token")]
        run = subprocess.run(argv + list(args), capture_output=True, text=True, timeout=timeout)
        assert run.returncode == 0, run.stderr
        return run.stdout

    def dump_logs(self):
        for path in self.logs:
            try:
                with open(path, errors="replace") as f:
                    sys.stderr.write("==== %s ====\n%s\n" % (path, f.read()[-20000:]))
            except OSError:
                pass

    def stop(self):
        # Workers first (they would otherwise log the coordinator's absence), then it.
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    c = Cluster(str(tmp_path_factory.mktemp("cluster")))
    yield c
    c.stop()


@pytest.fixture(scope="session")
def client(cluster):
    c = cluster.client()
    yield c
    c.close()


@pytest.fixture(scope="session")
def certs(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (scripts/install-deps.sh installs it)")
    d = str(tmp_path_factory.mktemp("certs") / "certs")
    subprocess.run([os.path.join(REPO, "scripts", "dev-certs.sh"), d, "--days", "2"], check=True,
                   capture_output=True, timeout=120)
    return d


@pytest.fixture(scope="session")
def tls_cluster(tmp_path_factory, certs):
    c = Cluster(str(tmp_path_factory.mktemp("tls-cluster")), certs=certs)
    yield c
    c.stop()
