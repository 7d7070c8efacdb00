"""The client over TLS, against a coordinator and workers using scripts/dev-certs.sh's
development certificates: a bearer token, a client certificate, the CLI's environment, and
the refusals."""

import os

import grpc
import pytest

import tandem
from conftest import tiny_spec


def test_token_submit_and_watch(tls_cluster, certs):
    with tandem.Client(tls_cluster.address, tls_ca=os.path.join(certs, "ca.crt"),
                       token_file=os.path.join(certs, "token")) as c:
        assert c.tls
        job = c.submit(tiny_spec("tls-token"))
        assert job.wait(timeout=120).state == "SUCCEEDED"
        assert len(job.history()) == 6


def test_client_certificate(tls_cluster, certs):
    pair = (os.path.join(certs, "client.crt"), os.path.join(certs, "client.key"))
    with tandem.Client(tls_cluster.address, tls_ca=os.path.join(certs, "ca.crt"), cert=pair) as c:
        assert len(c.workers()) == 2
        job = c.submit(tiny_spec("tls-cert", steps=2))
        assert job.wait(timeout=120).state == "SUCCEEDED"


def test_environment_variables(tls_cluster, certs, monkeypatch):
    monkeypatch.setenv("TANDEM_COORDINATOR", tls_cluster.address)
    monkeypatch.setenv("TANDEM_TLS_CA", os.path.join(certs, "ca.crt"))
    with open(os.path.join(certs, "token")) as f:
        monkeypatch.setenv("TANDEM_TOKEN", f.read().strip())
    with tandem.Client() as c:
        assert c.tls and len(c.workers()) == 2
    # $TANDEM_TOKEN_FILE wins over $TANDEM_TOKEN, as in the CLI.
    monkeypatch.setenv("TANDEM_TOKEN", "not-the-token-0123456789")
    monkeypatch.setenv("TANDEM_TOKEN_FILE", os.path.join(certs, "token"))
    with tandem.Client() as c:
        assert len(c.workers()) == 2
    monkeypatch.delenv("TANDEM_TOKEN_FILE")
    with tandem.Client() as c:
        with pytest.raises(tandem.TandemError) as e:
            c.workers()
        assert e.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_refusals(tls_cluster, certs):
    ca = os.path.join(certs, "ca.crt")
    with tandem.Client(tls_cluster.address, tls_ca=ca) as c:  # TLS, no credentials
        with pytest.raises(tandem.TandemError) as e:
            c.jobs()
        assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
    worker = (os.path.join(certs, "worker.crt"), os.path.join(certs, "worker.key"))
    with tandem.Client(tls_cluster.address, tls_ca=ca, cert=worker) as c:  # the wrong role
        with pytest.raises(tandem.TandemError) as e:
            c.jobs()
        assert e.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert "tandem-client" in e.value.message
    with tandem.Client(tls_cluster.address, timeout=3) as c:  # plaintext to a TLS port
        with pytest.raises(tandem.TandemError) as e:
            c.jobs()
        assert e.value.code == grpc.StatusCode.UNAVAILABLE
