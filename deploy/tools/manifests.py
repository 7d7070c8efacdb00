#!/usr/bin/env python3
"""Checks of Tandem's Kubernetes manifests against its binaries, and the plan of the rehearsal.

  manifests.py render OVERLAY                    print the overlay as kubectl kustomize renders it
  manifests.py validate [-k VERSION]... OVERLAY...
      every rendered document against the Kubernetes API schemas, offline and strict (unknown
      fields are errors), with kubernetes-validate
  manifests.py check --bin DIR OVERLAY...
      the manifests against the programs they run: flags each program accepts (--help), ports
      the flags open against container, probe and Service ports, the probes' health service
      names against the ones the programs serve, the workers' and the client's coordinator
      address against the coordinator's Service, the example job against `tandem validate`,
      the NetworkPolicies against the traffic Tandem needs, TLS and its credentials (the
      metrics port's scheme and token among them)
  manifests.py dockerfiles DIR
      the Dockerfiles build with the README's commands and run as a non-root user
  manifests.py rehearsal --bin DIR --run DIR --subnet PREFIX [--secrets DIR] OVERLAY
      for scripts/cluster-local.sh: the coordinator, worker and client pods of the overlay as
      processes, with the manifests' commands, arguments and environment (the files of the
      Secrets they mount from DIR/<secretName>/<key>)
  manifests.py probe --plan FILE --pod NAME --probe readiness|liveness
      one gRPC health probe as the kubelet sends it (exit 0 when SERVING)

Exit status: 0 when every check holds, 1 when one fails (each failure printed), 77 when a tool
the command needs is missing (ctest counts that as a skip).
"""

import argparse
import ipaddress
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

SKIP = 77

try:
    import yaml
except ImportError:  # the venv of scripts/install-deps.sh --test has it
    print("skip: PyYAML is not installed (scripts/install-deps.sh --test installs it)")
    sys.exit(SKIP)

PROGRAMS = ("tandem-coordinator", "tandem-worker", "tandem")
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "Job", "DaemonSet")
WILDCARD_HOSTS = ("0.0.0.0", "::", "[::]", "*")


def tool(name):
    path = shutil.which(name)
    if path is None:
        print(f"skip: {name} is not on PATH (scripts/install-deps.sh --test installs it into "
              ".cache/deploy-tools/venv)")
        sys.exit(SKIP)
    return path


def render(overlay):
    out = subprocess.run([tool("kubectl"), "kustomize", overlay], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"kubectl kustomize {overlay} failed:\n{out.stderr}")
    return out.stdout


def load(overlay):
    return [d for d in yaml.safe_load_all(render(overlay)) if d]


# ---- the pods of a rendered overlay -----------------------------------------------------------


class Container:
    """One container of a workload's pod template, with its pod's context."""

    def __init__(self, workload, spec, pod_spec, pod_labels, namespace):
        self.workload = workload
        self.spec = spec
        self.pod_spec = pod_spec
        self.pod_labels = pod_labels
        self.namespace = namespace
        self.name = f"{workload['kind']}/{workload['metadata']['name']}:{spec['name']}"
        command = spec.get("command") or []
        self.program = os.path.basename(command[0]) if command else ""
        self.raw_args = list(command[1:]) + list(spec.get("args") or [])

    def pod_names(self):
        kind, name = self.workload["kind"], self.workload["metadata"]["name"]
        if kind == "StatefulSet":
            return [f"{name}-{i}" for i in range(self.workload["spec"].get("replicas", 1))]
        if kind == "Deployment":
            return [f"{name}-{i}" for i in range(self.workload["spec"].get("replicas", 1))]
        return [f"{name}-0"]

    def env(self, pod_name, pod_ip="10.0.0.1"):
        """The container's environment as Kubernetes makes it (values and field refs)."""
        env = {}
        for e in self.spec.get("env") or []:
            if "value" in e:
                env[e["name"]] = expand(str(e["value"]), env)
            elif "valueFrom" in e and "fieldRef" in e["valueFrom"]:
                field = e["valueFrom"]["fieldRef"]["fieldPath"]
                env[e["name"]] = {"metadata.name": pod_name, "metadata.namespace": self.namespace,
                                  "status.podIP": pod_ip, "spec.nodeName": "node-0"}.get(
                                      field, f"<{field}>")
        return env

    def args(self, pod_name, pod_ip="10.0.0.1"):
        env = self.env(pod_name, pod_ip)
        return [expand(a, env) for a in self.raw_args]

    def flags(self, pod_name):
        """{name: value} of the --name=value arguments (dashes as underscores), and the rest."""
        flags, positional = {}, []
        for a in self.args(pod_name):
            if a.startswith("--"):
                name, _, value = a[2:].partition("=")
                flags[name.replace("-", "_")] = value
            else:
                positional.append(a)
        return flags, positional

    def ports(self):
        return {p["containerPort"]: p for p in self.spec.get("ports") or []}

    def port_number(self, port):
        """A Service targetPort or probe port (number or name) as a container port number."""
        if isinstance(port, int):
            return port
        for p in self.spec.get("ports") or []:
            if p.get("name") == port:
                return p["containerPort"]
        return None

    def mounts(self):
        """[(mountPath, volume)] of the container's volume mounts."""
        volumes = {v["name"]: v for v in self.pod_spec.get("volumes") or []}
        return [(m["mountPath"], volumes.get(m["name"], {"name": m["name"]}), m)
                for m in self.spec.get("volumeMounts") or []]

    def mount_of(self, path):
        best = None
        for mount_path, volume, mount in self.mounts():
            if path == mount_path or path.startswith(mount_path.rstrip("/") + "/"):
                if best is None or len(mount_path) > len(best[0]):
                    best = (mount_path, volume, mount)
        return best


def expand(text, env):
    """Kubernetes' $(VAR) expansion: defined variables replaced, $$ escapes, others kept."""
    def one(m):
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", one, text)


def containers(docs):
    out = []
    for d in docs:
        if d.get("kind") not in WORKLOAD_KINDS:
            continue
        template = d["spec"]["template"]
        for c in template["spec"].get("containers") or []:
            out.append(Container(d, c, template["spec"], template["metadata"].get("labels", {}),
                                 d["metadata"].get("namespace", "default")))
    return out


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def of_kind(docs, kind):
    return [d for d in docs if d.get("kind") == kind]


def split_host_port(address):
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return None, None
    return host.strip("[]"), int(port)


# ---- what the programs accept ------------------------------------------------------------------


class Programs:
    """The flags and health service names of the built programs, from their own help."""

    def __init__(self, bin_dir):
        self.bin_dir = bin_dir
        self.flags = {}
        self.help = {}
        self.commands = set()
        for p in PROGRAMS:
            path = os.path.join(bin_dir, p)
            if not os.access(path, os.X_OK):
                raise SystemExit(f"{path} is missing: build first")
            if p == "tandem":
                text = run([path, "help"]).stdout
                self.commands = set(re.findall(r"^  ([a-z]+)\b", text, re.M))
                self.flags[p] = {f.replace("-", "_") for f in re.findall(r"--([a-z][a-z-]*)", text)}
            else:
                # Abseil's --help lists main.cc's flags; --helpfull adds its own (--flagfile).
                text = run([path, "--helpfull"]).stdout + run([path, "--helpfull"]).stderr
                self.flags[p] = set(re.findall(r"^    --([a-z_0-9]+) \(", text, re.M))
                short = run([path, "--help"])
                if "--listen" not in short.stdout + short.stderr:
                    raise SystemExit(f"{p} --help lists no flags:\n{short.stdout}{short.stderr}")
            self.help[p] = text

    def health_services(self, program):
        """The health service names the program's --health_listen help says it serves."""
        m = re.search(r"--health_listen \((.*?)\); default", self.help[program], re.S)
        if not m:
            return set()
        text = " ".join(m.group(1).split())
        return set(re.findall(r'"([^"]*)"', text)) | set(re.findall(r"\btandem\.v1\.\w+", text))


def run(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, **kw)


# ---- check -------------------------------------------------------------------------------------


class Checker:
    def __init__(self, overlay, docs, programs):
        self.overlay = overlay
        self.docs = docs
        self.programs = programs
        self.errors = []
        self.notes = []
        self.metrics_services = []  # the Services that reach --metrics-listen's port
        self.metrics_https = False

    def fail(self, where, message):
        self.errors.append(f"{self.overlay}: {where}: {message}")

    def run(self):
        cs = containers(self.docs)
        by_program = {}
        for c in cs:
            if c.program not in PROGRAMS:
                self.fail(c.name, f"runs '{c.program}', not one of {', '.join(PROGRAMS)}")
                continue
            by_program.setdefault(c.program, []).append(c)
            self.check_flags(c)
        for p in PROGRAMS:
            if len(by_program.get(p, [])) != 1:
                self.fail("workloads", f"expected one container running {p}, found "
                          f"{len(by_program.get(p, []))}")
        if self.errors:
            return self.errors
        coordinator = by_program["tandem-coordinator"][0]
        worker = by_program["tandem-worker"][0]
        client = by_program["tandem"][0]
        api = self.check_daemon(coordinator, "listen")
        self.check_coordinator(coordinator, api)
        services = self.services_targeting(coordinator, api)
        if not services:
            self.fail(coordinator.name, f"no Service selects it on its API port {api}")
        self.check_metrics(coordinator, api)
        worker_api = self.check_daemon(worker, "listen")
        self.check_worker(worker, worker_api)
        self.check_coordinator_address(worker, services)
        self.check_coordinator_address(client, services)
        self.check_client(client)
        self.check_network(coordinator, worker, client, api, worker_api)
        self.check_security(coordinator, worker, client, services)
        return self.errors

    def check_flags(self, c):
        accepted = self.programs.flags[c.program]
        pod = c.pod_names()[0]
        for a in c.args(pod):
            if not a.startswith("-"):
                continue
            if c.program != "tandem" and "=" not in a:
                self.fail(c.name, f"write '{a}' as --flag=value (one argument each)")
            name = a.lstrip("-").partition("=")[0].replace("-", "_")
            if c.program == "tandem" and len(a) == 2:
                continue  # short flags (-o): tandem help lists them next to their long form
            if name not in accepted:
                self.fail(c.name, f"{c.program} does not accept {a.partition('=')[0]} (not in "
                          f"its --help)")
        for a in c.args(pod):
            if "$(" in a:
                self.fail(c.name, f"'{a}' refers to a variable the container does not define")

    def check_daemon(self, c, listen_flag):
        """Listen and health ports against the container's ports and probes; the API port."""
        flags, _ = c.flags(c.pod_names()[0])
        host, api = split_host_port(flags.get(listen_flag, ""))
        if api is None:
            self.fail(c.name, f"--{listen_flag} HOST:PORT is missing")
            return None
        if host not in WILDCARD_HOSTS:
            self.fail(c.name, f"--{listen_flag}={flags[listen_flag]}: listen on every address "
                      "(0.0.0.0), or nothing outside the pod reaches it")
        if api not in c.ports():
            self.fail(c.name, f"--{listen_flag} opens port {api}, which is not a container port")
        hhost, health = split_host_port(flags.get("health_listen", ""))
        if health is None:
            self.fail(c.name, "--health-listen HOST:PORT is missing: the probes need it")
            return api
        if hhost not in WILDCARD_HOSTS:
            self.fail(c.name, "--health-listen must listen on every address: the kubelet "
                      "probes the pod's IP")
        if health == api:
            self.fail(c.name, "the health port must not be the API port")
        if health not in c.ports():
            self.fail(c.name, f"--health-listen opens port {health}, not a container port")
        served = self.programs.health_services(c.program)
        for kind in ("readinessProbe", "livenessProbe"):
            probe = c.spec.get(kind)
            if not probe or "grpc" not in probe:
                self.fail(c.name, f"{kind} must be a gRPC probe on the health port")
                continue
            port, service = probe["grpc"].get("port"), probe["grpc"].get("service", "")
            if port != health:
                self.fail(c.name, f"{kind} probes port {port}; --health-listen opens {health}")
            if service not in served:
                self.fail(c.name, f"{kind} asks for health service '{service}'; {c.program} "
                          f"serves {sorted(served)}")
        live = c.spec.get("livenessProbe", {}).get("grpc", {}).get("service", "")
        if live != "liveness":
            self.fail(c.name, "livenessProbe should ask for 'liveness': readiness fails while "
                      "a worker waits for its coordinator, which is no reason to restart it")
        for kind in ("requests", "limits"):
            if not c.spec.get("resources", {}).get(kind):
                self.fail(c.name, f"resources.{kind} are missing")
        return api

    def check_coordinator(self, c, api):
        spec = c.workload["spec"]
        if c.workload["kind"] != "Deployment" or spec.get("replicas") != 1 or \
                spec.get("strategy", {}).get("type") != "Recreate":
            self.fail(c.name, "the coordinator must be a Deployment of 1 replica, Recreate: two "
                      "coordinators must never share a data root")
        flags, _ = c.flags(c.pod_names()[0])
        root = flags.get("data_root", "")
        mount = c.mount_of(root) if root else None
        if mount is None or "persistentVolumeClaim" not in mount[1]:
            self.fail(c.name, f"--data-root={root} must lie on a PersistentVolumeClaim mount: "
                      "jobs and checkpoints outlive the pod")
        else:
            claim = mount[1]["persistentVolumeClaim"]["claimName"]
            if not any(d["metadata"]["name"] == claim for d in of_kind(self.docs,
                                                                       "PersistentVolumeClaim")):
                self.fail(c.name, f"claim {claim} is not among the manifests")
        if not any(selects(d["spec"].get("selector", {}).get("matchLabels"), c.pod_labels)
                   for d in of_kind(self.docs, "PodDisruptionBudget")):
            self.fail(c.name, "no PodDisruptionBudget covers the coordinator")
        # The coordinator's own TANDEM_COORDINATOR serves `kubectl exec ... tandem`.
        own = c.env(c.pod_names()[0]).get("TANDEM_COORDINATOR")
        if own is not None and own != f"127.0.0.1:{api}":
            self.fail(c.name, f"TANDEM_COORDINATOR={own}: inside the coordinator's pod it "
                      f"should be 127.0.0.1:{api}")

    def check_metrics(self, c, api):
        """--metrics-listen: a container port of its own, reached by a Service."""
        flags, _ = c.flags(c.pod_names()[0])
        if "metrics_listen" not in flags:
            return
        host, port = split_host_port(flags["metrics_listen"])
        if port is None:
            self.fail(c.name, f"--metrics-listen={flags['metrics_listen']}: expected HOST:PORT")
            return
        if host not in WILDCARD_HOSTS:
            self.fail(c.name, "--metrics-listen must listen on every address, or nothing "
                      "outside the pod reaches it")
        if port == api:
            self.fail(c.name, "the metrics port must not be the API port")
        if port not in c.ports():
            self.fail(c.name, f"--metrics-listen opens port {port}, which is not a container port")
        elif not self.services_targeting(c, port):
            self.fail(c.name, f"no Service selects it on its metrics port {port}")

    def services_targeting(self, c, port):
        """[(service name, service port)] of Services that reach container port `port`."""
        out = []
        for s in of_kind(self.docs, "Service"):
            if not selects(s["spec"].get("selector"), c.pod_labels):
                continue
            for p in s["spec"].get("ports") or []:
                target = c.port_number(p.get("targetPort", p["port"]))
                if target == port:
                    if p["port"] != target:
                        self.fail(f"Service/{s['metadata']['name']}", f"port {p['port']} "
                                  f"targets {target}: keep them equal (the same address then "
                                  "works with and without the Service in between)")
                    out.append((s, p["port"]))
        return out

    def check_worker(self, c, api):
        sts = c.workload
        if sts["kind"] != "StatefulSet":
            self.fail(c.name, "workers must be a StatefulSet (stable DNS names)")
            return
        svc_name = sts["spec"].get("serviceName")
        headless = [s for s, _ in self.services_targeting(c, api)
                    if s["metadata"]["name"] == svc_name]
        if not headless:
            self.fail(c.name, f"serviceName {svc_name} is not a Service selecting the workers on "
                      f"port {api}")
        else:
            spec = headless[0]["spec"]
            if spec.get("clusterIP") != "None":
                self.fail(f"Service/{svc_name}", "must be headless (clusterIP: None)")
            if not spec.get("publishNotReadyAddresses"):
                self.fail(f"Service/{svc_name}", "needs publishNotReadyAddresses: a worker's "
                          "name must resolve as soon as it registers under it")
        for pod in c.pod_names():
            flags, _ = c.flags(pod)
            host, port = split_host_port(flags.get("advertise", ""))
            want = f"{pod}.{svc_name}.{c.namespace}.svc"
            if host is None or not (host == want or host.startswith(want + ".")):
                self.fail(c.name, f"pod {pod} advertises '{flags.get('advertise')}'; its DNS "
                          f"name is {want}.<cluster domain>")
            elif port not in (api, 0):
                self.fail(c.name, f"pod {pod} advertises port {port}; it listens on {api}")
        flags, _ = c.flags(c.pod_names()[0])
        root = flags.get("data_root", "")
        if not root or c.mount_of(root) is None:
            self.fail(c.name, f"--data-root={root} is not a volume mount (datasets)")
        limits = c.spec.get("resources", {}).get("limits", {})
        if "nvidia.com/gpu" in limits:
            shm = c.mount_of("/dev/shm")
            if shm is None or shm[0] != "/dev/shm" or \
                    shm[1].get("emptyDir", {}).get("medium") != "Memory":
                self.fail(c.name, "a GPU worker needs a memory-backed /dev/shm (NCCL)")
            if str(limits["nvidia.com/gpu"]) != "1":
                self.fail(c.name, "one GPU per worker")
        threads = flags.get("threads")
        cpu = str(c.spec.get("resources", {}).get("requests", {}).get("cpu", ""))
        if threads and cpu.isdigit() and int(threads) > int(cpu):
            self.fail(c.name, f"--threads={threads} exceeds the CPU request {cpu}")

    def check_coordinator_address(self, c, services):
        pod = c.pod_names()[0]
        flags, _ = c.flags(pod)
        address = flags.get("coordinator") or c.env(pod).get("TANDEM_COORDINATOR")
        if not address:
            self.fail(c.name, "no coordinator address (--coordinator or TANDEM_COORDINATOR)")
            return
        host, port = split_host_port(address)
        for s, sport in services:
            name = s["metadata"]["name"]
            ns = s["metadata"].get("namespace", "default")
            names = {name, f"{name}.{ns}", f"{name}.{ns}.svc"}
            if port == sport and (host in names or host.startswith(f"{name}.{ns}.svc.")):
                return
        known = ", ".join(f"{s['metadata']['name']}:{p}" for s, p in services)
        self.fail(c.name, f"coordinator address {address} is not the coordinator's Service "
                  f"({known})")

    def check_client(self, c):
        _, positional = c.flags(c.pod_names()[0])
        if not positional or positional[0] not in self.programs.commands:
            self.fail(c.name, f"tandem {' '.join(positional)}: not a command of `tandem help`")
            return
        if positional[0] != "submit" or len(positional) < 2:
            return
        path = positional[1]
        mount = c.mount_of(path)
        if mount is None or "configMap" not in mount[1]:
            self.fail(c.name, f"{path} is not in a ConfigMap volume")
            return
        cm_name = mount[1]["configMap"]["name"]
        key = os.path.relpath(path, mount[0])
        for item in mount[1]["configMap"].get("items") or []:
            if item["path"] == key:
                key = item["key"]
        cms = [d for d in of_kind(self.docs, "ConfigMap") if d["metadata"]["name"] == cm_name]
        if not cms or key not in (cms[0].get("data") or {}):
            self.fail(c.name, f"ConfigMap {cm_name} has no key {key} for {path}")
            return
        # The real client checks the job file the Job submits.
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            f.write(cms[0]["data"][key])
            f.flush()
            out = run([os.path.join(self.programs.bin_dir, "tandem"), "validate", "-o", "json",
                       f.name])
        if out.returncode != 0:
            self.fail(f"ConfigMap/{cm_name}", f"tandem validate {key}: {out.stderr.strip()}")
        else:
            spec = json.loads(out.stdout)
            stages = spec.get("pipeline", {}).get("stages", 1)
            workers = [w for w in containers(self.docs) if w.program == "tandem-worker"]
            replicas = workers[0].workload["spec"].get("replicas", 1) if workers else 0
            if stages > replicas:
                self.fail(f"ConfigMap/{cm_name}", f"the example needs {stages} workers; the "
                          f"StatefulSet has {replicas}")

    def check_network(self, coordinator, worker, client, api, worker_api):
        policies = of_kind(self.docs, "NetworkPolicy")
        outsider = {"app": "something-else"}
        health = {c.program: split_host_port(c.flags(c.pod_names()[0])[0].get("health_listen",
                                                                              ""))[1]
                  for c in (coordinator, worker)}
        cases = [
            (worker, coordinator, api, True, "worker -> coordinator API"),
            (client, coordinator, api, True, "client -> coordinator API"),
            (None, coordinator, api, False, "another pod -> coordinator API"),
            (coordinator, worker, worker_api, True, "coordinator -> worker API"),
            (worker, worker, worker_api, True, "worker -> worker API"),
            (worker, worker, 40123, True, "worker -> worker data plane (any port)"),
            (client, worker, worker_api, False, "client -> worker API"),
            (None, worker, 40123, False, "another pod -> worker data plane"),
            (None, coordinator, health["tandem-coordinator"], True, "probe -> coordinator health"),
            (None, worker, health["tandem-worker"], True, "probe -> worker health"),
        ]
        for src, dst, port, want, what in cases:
            src_labels = src.pod_labels if src else outsider
            got = admits(policies, dst, src_labels, port)
            if got is None:
                self.fail("NetworkPolicy", f"no policy selects {dst.name}")
                return
            if got != want:
                self.fail("NetworkPolicy", f"{what} (port {port}) is "
                          f"{'admitted' if got else 'refused'}; it should be "
                          f"{'admitted' if want else 'refused'}")


    # ---- TLS and mutual authentication (common/tls.h; deploy/k8s/secure) ----

    def check_security(self, coordinator, worker, client, services):
        """TLS on every side or on none; each side's credentials complete; every file a flag
        (or the CLI's environment) names on a read-only Secret mount the container can read,
        keys not world-readable; the names the pods dial in the certificates
        scripts/dev-certs.sh makes for this namespace."""
        def settings(c):
            pod = c.pod_names()[0]
            flags, _ = c.flags(pod)
            env = c.env(pod)
            out = {k: flags[k] for k in TLS_FILE_FLAGS if k in flags}
            for var, flag in CLI_ENV_FLAGS.items():  # the CLI's environment defaults
                if c.program == "tandem" or var in env:
                    if var in env and flag not in out:
                        out[flag] = env[var]
            return out
        co, wo, cl = settings(coordinator), settings(worker), settings(client)
        for c, f in ((coordinator, co), (worker, wo)):
            have = [k for k in ("tls_cert", "tls_key", "tls_ca") if k in f]
            if have and len(have) != 3:
                self.fail(c.name, "--tls-cert, --tls-key and --tls-ca go together (mutual TLS); "
                          f"it has only {', '.join('--' + k.replace('_', '-') for k in have)}")
        co_tls, wo_tls, cl_tls = "tls_cert" in co, "tls_cert" in wo, "tls_ca" in cl
        self.check_metrics_scheme(coordinator, co_tls)
        if co_tls != wo_tls:
            self.fail(worker.name, "the coordinator serves TLS but the workers dial it in "
                      "plaintext (they would never register)" if co_tls else
                      "the workers have TLS flags but the coordinator serves plaintext")
        if co_tls != cl_tls:
            self.fail(client.name, "the coordinator serves TLS but the client dials it in "
                      "plaintext (give it --tls-ca)" if co_tls else
                      "the client has --tls-ca but the coordinator serves plaintext")
        if "auth_token_file" in co and not co_tls:
            self.fail(coordinator.name, "--auth-token-file without TLS: the coordinator refuses it")
        if co_tls and cl_tls:
            has_cert = "tls_cert" in cl and "tls_key" in cl
            has_token = "token_file" in cl or "TANDEM_TOKEN" in \
                {e["name"] for e in client.spec.get("env") or []}
            if not has_cert and not has_token:
                self.fail(client.name, "TLS without credentials: the coordinator answers "
                          "UNAUTHENTICATED (give --tls-cert and --tls-key, or a token)")
            if has_token and not has_cert and "auth_token_file" not in co:
                self.fail(client.name, "sends a token, but the coordinator has no "
                          "--auth-token-file to check it against")
        for c, f in ((coordinator, co), (worker, wo), (client, cl)):
            for flag, path in sorted(f.items()):
                self.check_secret_file(c, flag, path)
        if co_tls and wo_tls and not self.errors:
            self.check_certificate_names(coordinator, worker, client, services)

    def check_metrics_scheme(self, c, tls):
        """The metrics port serves HTTPS when the coordinator has TLS, unless --metrics-plaintext
        (coordinator/main.cc): --metrics-token-file goes with HTTPS only, and the Services that
        reach the port tell Prometheus the scheme it serves (prometheus.io/scheme, appProtocol)."""
        flags, _ = c.flags(c.pod_names()[0])
        plaintext = flags.get("metrics_plaintext", "false").lower() in ("", "true", "t", "1",
                                                                        "yes", "y")
        if "metrics_listen" not in flags:
            for f in ("metrics_token_file", "metrics_plaintext"):
                if f in flags:
                    self.fail(c.name, f"--{f.replace('_', '-')} without --metrics-listen does "
                              "nothing")
            return
        https = tls and not plaintext
        self.metrics_https = https
        if "metrics_token_file" in flags and not https:
            self.fail(c.name, "--metrics-token-file without HTTPS on the metrics port: the "
                      "coordinator refuses it (it needs the --tls-* flags and no "
                      "--metrics-plaintext)")
        _, port = split_host_port(flags["metrics_listen"])
        scheme = "https" if https else "http"
        why = ("the coordinator has TLS" if https else
               "--metrics-plaintext" if tls else "the coordinator has no TLS")
        for s in of_kind(self.docs, "Service"):
            if not selects(s["spec"].get("selector"), c.pod_labels):
                continue
            ports = [p for p in s["spec"].get("ports") or []
                     if c.port_number(p.get("targetPort", p["port"])) == port]
            if not ports:
                continue
            self.metrics_services.append(s)
            where = f"Service/{s['metadata']['name']}"
            said = (s["metadata"].get("annotations") or {}).get("prometheus.io/scheme")
            if said != scheme and (https or said is not None):
                self.fail(where, f"prometheus.io/scheme is {said!r} but the metrics port serves "
                          f"{scheme.upper()} ({why}): Prometheus would fail every scrape")
            for p in ports:
                if p.get("appProtocol", scheme) != scheme:
                    self.fail(where, f"port {p['port']} says appProtocol {p['appProtocol']}; the "
                              f"metrics port serves {scheme} ({why})")

    def check_secret_file(self, c, flag, path):
        what = f"--{flag.replace('_', '-')}={path}"
        mount = c.mount_of(path) if path.startswith("/") else None
        if mount is None or "secret" not in mount[1]:
            self.fail(c.name, f"{what} is not on a Secret volume mount")
            return
        mount_path, volume, m = mount
        if not m.get("readOnly"):
            self.fail(c.name, f"{what}: mount {mount_path} read-only")
        key = os.path.relpath(path, mount_path)
        items = volume["secret"].get("items")
        if items and key not in [i["path"] for i in items]:
            self.fail(c.name, f"{what}: Secret {volume['secret'].get('secretName')}'s items do "
                      f"not project {key}")
        mode = volume["secret"].get("defaultMode", 0o644)
        pod_sc = c.pod_spec.get("securityContext") or {}
        user = (c.spec.get("securityContext") or {}).get("runAsUser", pod_sc.get("runAsUser", 0))
        readable = user == 0 or mode & 0o004 or (pod_sc.get("fsGroup") is not None and mode & 0o040)
        if not readable:
            self.fail(c.name, f"{what}: Secret files are mode {mode:o}, owned by root"
                      f"{' and group ' + str(pod_sc['fsGroup']) if 'fsGroup' in pod_sc else ''}"
                      f"; user {user} cannot read them (defaultMode 0440 with the pod's fsGroup)")
        if flag in ("tls_key", "auth_token_file", "token_file", "metrics_token_file") and \
                mode & 0o004:
            self.fail(c.name, f"{what}: a key or token must not be world-readable (Secret "
                      f"defaultMode {mode:o}; use 0440 with the pod's fsGroup)")

    def check_certificate_names(self, coordinator, worker, client, services):
        """Every name a pod dials is in the certificate of the pod it dials, as
        scripts/dev-certs.sh makes them for the overlay's namespace and cluster domain."""
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                              "dev-certs.sh")
        if shutil.which("openssl") is None:
            self.notes.append("certificate names not checked: openssl is not installed")
            return
        pod = worker.pod_names()[0]
        domain = worker.env(pod).get("TANDEM_CLUSTER_DOMAIN", "cluster.local")
        with tempfile.TemporaryDirectory() as tmp:
            out = run([script, tmp, "--namespace", worker.namespace, "--cluster-domain", domain])
            if out.returncode != 0:
                self.fail("scripts/dev-certs.sh", out.stderr.strip())
                return
            dials = []  # (who, the name dialled, the certificate that must carry it)
            for c in (worker, client, coordinator):
                p = c.pod_names()[0]
                flags, _ = c.flags(p)
                address = flags.get("coordinator") or c.env(p).get("TANDEM_COORDINATOR")
                if address:
                    dials.append((c.name, split_host_port(address)[0], "coordinator"))
            for p in worker.pod_names():
                host, _ = split_host_port(worker.flags(p)[0].get("advertise", ""))
                if host:
                    dials.append((f"{coordinator.name} -> {p}", host, "worker"))
            for s in self.metrics_services if self.metrics_https else []:
                name = s["metadata"]["name"]  # Prometheus, dialling the metrics port by name
                ns = s["metadata"].get("namespace", "default")
                dials.append((f"Prometheus -> Service/{name}", f"{name}.{ns}.svc", "coordinator"))
            for who, host, cert in dials:
                is_ip = re.fullmatch(r"[0-9.]+|.*:.*", host) is not None
                check = run(["openssl", "x509", "-in", os.path.join(tmp, f"{cert}.crt"), "-noout",
                             "-checkip" if is_ip else "-checkhost", host])
                if "does match" not in check.stdout:
                    self.fail(who, f"dials {host}, which the {cert} certificate of "
                              "scripts/dev-certs.sh does not name (a TLS handshake would fail)")


# What the CLI reads from its environment when the flag is not given (coordinator/cli/args.h).
CLI_ENV_FLAGS = {"TANDEM_TLS_CA": "tls_ca", "TANDEM_TLS_CERT": "tls_cert",
                 "TANDEM_TLS_KEY": "tls_key", "TANDEM_TOKEN_FILE": "token_file"}
TLS_FILE_FLAGS = ("tls_cert", "tls_key", "tls_ca", "auth_token_file", "token_file",
                  "metrics_token_file")


def admits(policies, dst, src_labels, port):
    """Whether ingress policies admit `src_labels` (same namespace) to `dst` on TCP `port`;
    None when no policy selects `dst` (everything is admitted then)."""
    selecting = [p for p in policies
                 if "Ingress" in p["spec"].get("policyTypes", ["Ingress"]) and
                 (not p["spec"].get("podSelector") or
                  selects(p["spec"]["podSelector"].get("matchLabels"), dst.pod_labels))]
    if not selecting:
        return None
    for p in selecting:
        for rule in p["spec"].get("ingress") or []:
            sources = rule.get("from")
            from_ok = not sources or any(
                "podSelector" in s and "namespaceSelector" not in s and
                (not s["podSelector"] or selects(s["podSelector"].get("matchLabels"), src_labels))
                for s in sources)
            ports = rule.get("ports")
            port_ok = not ports or any(
                pp.get("protocol", "TCP") == "TCP" and
                (dst.port_number(pp.get("port")) == port or pp.get("port") is None)
                for pp in ports)
            if from_ok and port_ok:
                return True
    return False


# ---- Dockerfiles -------------------------------------------------------------------------------


def check_dockerfiles(directory):
    errors = []
    files = sorted(f for f in os.listdir(directory) if f.startswith("Dockerfile"))
    if not files:
        return [f"{directory}: no Dockerfile"]
    for f in files:
        text = open(os.path.join(directory, f)).read()
        # Join continued lines, then look at the instructions.
        lines = re.sub(r"\\\n", " ", text).splitlines()
        instructions = [l.strip() for l in lines if l.strip() and not l.strip().startswith("#")]
        stages = [i for i in instructions if i.upper().startswith("FROM ")]
        if len(stages) < 2:
            errors.append(f"{f}: expected a multi-stage build")
        runs = " ".join(i for i in instructions if i.upper().startswith("RUN "))
        for cmd in ("./scripts/install-deps.sh", "./scripts/build.sh"):
            if cmd not in runs:
                errors.append(f"{f}: the build does not run {cmd} (the README's commands)")
        # A GPU image (on NVIDIA's CUDA base) builds tandem-worker with the toolkit; without it
        # the worker builds CPU-only and refuses --device cuda:N on every GPU node.
        if "nvidia/cuda" in text:
            if "./scripts/install-cuda-toolkit.sh" not in runs:
                errors.append(f"{f}: a GPU image must install the CUDA toolkit in its build "
                              "(./scripts/install-cuda-toolkit.sh), or tandem-worker has no CUDA")
            if not re.search(r"bundle\.sh\s+--cuda\b", runs):
                errors.append(f"{f}: a GPU image must bundle with bundle.sh --cuda (which refuses "
                              "a tandem-worker built without CUDA)")
        last = instructions[instructions.index(stages[-1]):] if stages else []
        users = [i.split()[1] for i in last if i.upper().startswith("USER ")]
        if not users or users[-1].split(":")[0] in ("root", "0"):
            errors.append(f"{f}: the final stage must run as a non-root USER")
        for program in PROGRAMS:
            if not re.search(rf"\b{re.escape(program)}\b", " ".join(last)):
                errors.append(f"{f}: the final stage does not ship {program}")
    return errors


# ---- rehearsal ---------------------------------------------------------------------------------


def rehearsal(args):
    """Writes RUN/plan.json, RUN/hosts and each pod's directories and launch script."""
    docs = load(args.overlay)
    net = ipaddress.ip_network(args.subnet, strict=False)
    hosts = list(net.hosts())
    pods, hosts_lines = [], []
    next_ip = 10
    for c in containers(docs):
        role = {"tandem-coordinator": "coordinator", "tandem-worker": "worker",
                "tandem": "client"}.get(c.program)
        if role is None:
            raise SystemExit(f"{c.name} runs {c.program}")
        for pod in c.pod_names():
            ip = str(hosts[next_ip])
            next_ip += 1
            names = []
            if c.workload["kind"] == "StatefulSet":
                svc = c.workload["spec"]["serviceName"]
                names += [f"{pod}.{svc}.{c.namespace}.svc.cluster.local", f"{pod}.{svc}"]
            advertised, _ = split_host_port(c.flags(pod)[0].get("advertise", ""))
            if advertised and advertised not in names:
                names.append(advertised)
            # Services that select the pod resolve to it (no proxy: Service port = target).
            for s in of_kind(docs, "Service"):
                if selects(s["spec"].get("selector"), c.pod_labels) and \
                        s["spec"].get("clusterIP") != "None":
                    n = s["metadata"]["name"]
                    names += [f"{n}.{c.namespace}.svc.cluster.local", f"{n}.{c.namespace}.svc",
                              f"{n}.{c.namespace}", n]
            hosts_lines.append(f"{ip}\t{' '.join(names + [pod])}")
            root = os.path.join(args.run, "pods", pod)
            os.makedirs(root, exist_ok=True)
            argv, env = [os.path.join(args.bin, c.program)], dict(c.env(pod, ip))
            mounts = c.mounts()
            for mount_path, volume, mount in mounts:
                local = os.path.join(root, mount_path.lstrip("/"))
                if mount_path == "/dev/shm":
                    continue
                os.makedirs(local, exist_ok=True)
                if "configMap" in volume:
                    cm = [d for d in of_kind(docs, "ConfigMap")
                          if d["metadata"]["name"] == volume["configMap"]["name"]][0]
                    for key, value in (cm.get("data") or {}).items():
                        with open(os.path.join(local, key), "w") as f:
                            f.write(value)
                if "secret" in volume:
                    # Secrets are not in the manifests: their files come from --secrets
                    # DIR/<secretName>/<key>, with the volume's mode, as the kubelet writes them.
                    name = volume["secret"]["secretName"]
                    given = os.path.join(args.secrets or "", name)
                    if not args.secrets or not os.path.isdir(given):
                        raise SystemExit(f"{c.name} mounts Secret {name}: give its files in "
                                         f"--secrets DIR/{name}/")
                    for key in sorted(os.listdir(given)):
                        shutil.copyfile(os.path.join(given, key), os.path.join(local, key))
                        os.chmod(os.path.join(local, key),
                                 volume["secret"].get("defaultMode", 0o644))

            def local_path(p):
                for mount_path, _, _ in sorted(mounts, key=lambda m: -len(m[0])):
                    if p == mount_path or p.startswith(mount_path.rstrip("/") + "/"):
                        return os.path.join(root, p.lstrip("/"))
                return p
            # File names in the environment (TANDEM_TLS_CA=...) are mapped as arguments are.
            env = {k: local_path(v) for k, v in env.items()}
            for a in c.args(pod, ip):
                if a.startswith("--") and "=" in a:
                    name, _, value = a.partition("=")
                    argv.append(f"{name}={local_path(value)}")
                else:
                    argv.append(local_path(a))
            probes = {}
            for kind in ("readiness", "liveness"):
                g = (c.spec.get(f"{kind}Probe") or {}).get("grpc")
                if g:
                    probes[kind] = {"port": g["port"], "service": g.get("service", "")}
            user = (c.spec.get("securityContext") or {}).get("runAsUser") or \
                (c.pod_spec.get("securityContext") or {}).get("runAsUser") or 0
            # The image's PATH has the programs first; the pod's environment is all there is.
            env_words = " ".join(shlex.quote(f"{k}={v}") for k, v in
                                 [("PATH", f"{args.bin}:/usr/bin:/bin"), ("HOME", "/tmp")] +
                                 list(env.items()))
            script = os.path.join(args.run, "pods", f"{pod}.sh")
            with open(script, "w") as f:
                f.write(f"#!/bin/sh\n# {c.name} as a process: its command and environment, "
                        "volume paths mapped into the rehearsal's directory.\n"
                        "# Arguments (a wrapper such as setpriv) go before the command.\n")
                f.write(f"cd {shlex.quote(root)}\n")
                f.write(f"exec env -i {env_words} \"$@\" " +
                        " ".join(shlex.quote(a) for a in argv) + "\n")
            exec_script = os.path.join(args.run, "pods", f"{pod}.exec.sh")
            with open(exec_script, "w") as f:
                f.write(f"#!/bin/sh\n# `kubectl exec` into {c.name}: its environment, then the "
                        "command given.\n")
                f.write(f"cd {shlex.quote(root)}\nexec env -i {env_words} \"$@\"\n")
            os.chmod(script, 0o755)
            os.chmod(exec_script, 0o755)
            pods.append({"name": pod, "role": role, "ip": ip, "user": user, "root": root,
                         "script": script, "exec": exec_script, "argv": argv, "env": env,
                         "probes": probes, "container": c.name})
    with open(os.path.join(args.run, "hosts"), "w") as f:
        f.write("127.0.0.1\tlocalhost\n" + "\n".join(hosts_lines) + "\n")
    with open(os.path.join(args.run, "plan.json"), "w") as f:
        json.dump({"pods": pods, "node_ip": str(hosts[0]), "prefix": net.prefixlen}, f, indent=1)
    for p in pods:
        print(p["name"], p["role"], p["ip"], p["user"], p["script"], p["exec"], p["root"],
              ",".join(p["probes"]), sep="\t")
    return 0


def probe(args):
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    plan = json.load(open(args.plan))
    pod = [p for p in plan["pods"] if p["name"] == args.pod][0]
    spec = pod["probes"].get(args.probe)
    if spec is None:
        print(f"{args.pod}: no {args.probe} probe")
        return 1
    with grpc.insecure_channel(f"{pod['ip']}:{spec['port']}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            resp = stub.Check(health_pb2.HealthCheckRequest(service=spec["service"]), timeout=1)
        except grpc.RpcError as e:
            print(f"{args.pod} {args.probe} ({pod['ip']}:{spec['port']} "
                  f"'{spec['service']}'): {e.code().name}")
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
    print(f"{args.pod} {args.probe} ({pod['ip']}:{spec['port']} '{spec['service']}'): {status}")
    return 0 if resp.status == health_pb2.HealthCheckResponse.SERVING else 1


# ---- main --------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("render")
    p.add_argument("overlay")
    p = sub.add_parser("validate")
    p.add_argument("-k", "--kubernetes-version", action="append", dest="versions")
    p.add_argument("overlays", nargs="+")
    p = sub.add_parser("check")
    p.add_argument("--bin", required=True)
    p.add_argument("overlays", nargs="+")
    p = sub.add_parser("mutants")
    p.add_argument("--bin", required=True)
    p.add_argument("directory")
    p = sub.add_parser("dockerfiles")
    p.add_argument("directory")
    p = sub.add_parser("rehearsal")
    p.add_argument("--bin", required=True)
    p.add_argument("--run", required=True)
    p.add_argument("--subnet", required=True)
    p.add_argument("--secrets", help="DIR/<secretName>/<key>: the files of the Secrets that "
                   "the pods mount")
    p.add_argument("overlay")
    p = sub.add_parser("probe")
    p.add_argument("--plan", required=True)
    p.add_argument("--pod", required=True)
    p.add_argument("--probe", choices=("readiness", "liveness"), required=True)
    args = ap.parse_args()

    if args.command == "render":
        sys.stdout.write(render(args.overlay))
        return 0
    if args.command == "validate":
        validator = tool("kubernetes-validate")
        versions = args.versions or ["1.29.0", "1.37.0"]
        failed = 0
        with tempfile.TemporaryDirectory() as tmp:
            for overlay in args.overlays:
                path = os.path.join(tmp, overlay.strip("/").replace("/", "_") + ".yaml")
                with open(path, "w") as f:
                    f.write(render(overlay))
                n = sum(1 for d in yaml.safe_load_all(open(path)) if d)
                for v in versions:
                    out = run([validator, "--strict", "--quiet", "-k", v, path])
                    ok = out.returncode == 0
                    failed += not ok
                    print(f"{overlay}: {n} documents against Kubernetes {v}: "
                          f"{'valid' if ok else 'INVALID'}")
                    if not ok:
                        print(out.stdout + out.stderr)
            # The validator must be able to fail: a misspelt field in a copy of a Deployment.
            bad = os.path.join(tmp, "bad.yaml")
            docs = [d for d in yaml.safe_load_all(render(args.overlays[0])) if d]
            dep = next(d for d in docs if d["kind"] == "Deployment")
            dep["spec"]["template"]["spec"]["containers"][0]["readinessProb"] = {}
            with open(bad, "w") as f:
                yaml.safe_dump(dep, f)
            if run([validator, "--strict", "--quiet", "-k", versions[-1], bad]).returncode == 0:
                print("kubernetes-validate accepted a misspelt field: it checks nothing")
                failed += 1
        return 1 if failed else 0
    if args.command == "check":
        programs = Programs(args.bin)
        errors = []
        for overlay in args.overlays:
            docs = load(overlay)
            found = Checker(overlay, docs, programs).run()
            errors += found
            print(f"{overlay}: {len(containers(docs))} containers, "
                  f"{'consistent with the binaries' if not found else f'{len(found)} problem(s)'}")
        for e in errors:
            print("  " + e)
        return 1 if errors else 0
    if args.command == "mutants":
        # Each subdirectory is an overlay with one mistake; `expect` names the failure that
        # `check` must report for it.
        programs = Programs(args.bin)
        missed = 0
        for name in sorted(os.listdir(args.directory)):
            overlay = os.path.join(args.directory, name)
            if not os.path.isfile(os.path.join(overlay, "expect")):
                continue
            want = open(os.path.join(overlay, "expect")).read().strip()
            found = Checker(name, load(overlay), programs).run()
            if any(want in e for e in found):
                print(f"{name}: caught ({want})")
            else:
                missed += 1
                print(f"{name}: NOT caught; expected a failure naming '{want}', got:")
                for e in found or ["(no failure)"]:
                    print("  " + e)
        return 1 if missed else 0
    if args.command == "dockerfiles":
        errors = check_dockerfiles(args.directory)
        for e in errors:
            print(e)
        if not errors:
            print(f"{args.directory}: multi-stage, README build commands, non-root, ships "
                  f"{', '.join(PROGRAMS)}; GPU images build with CUDA")
        return 1 if errors else 0
    if args.command == "rehearsal":
        return rehearsal(args)
    if args.command == "probe":
        return probe(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
