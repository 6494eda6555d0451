#!/usr/bin/env python3
"""Renders every variant of deploy/k8s and checks it offline.

Each variant (single-node, data-parallel and multi-node, each also with the
api-key component) is rendered with `kubectl kustomize` (kustomize v5, in
kubectl 1.27 and later), then:
  - every object is validated against the Kubernetes JSON schemas that
    kubernetes-validate bundles, for the oldest and the newest Kubernetes
    the manifests target (KUBE_VERSIONS), strictly: unknown fields fail;
  - every LeaderWorkerSet against k8s_lws_schema.yaml (our own minimal
    schema: no PyPI package ships the LWS CRD), and its two pod templates,
    with its metadata, as v1 PodTemplates against the Kubernetes schema;
  - ferrum's own rules (check_* below): probes on GET /health port 8000,
    /dev/shm an in-memory emptyDir, GPU limits equal to the tensor-parallel
    ranks, a grace period long enough to drain, flags that `ferrumctl serve`
    and `ferrum-worker` know (from their --help, where a build is found),
    $(VAR)s that resolve, Services that reach the serving pods only, ...
yamllint --strict checks the sources (deploy/k8s/yamllint.yaml). Negative
cases then show that each kind of check catches what it is for: copies of
the manifests with a bad field, a probe on the wrong port, an unknown flag,
... must each be rejected.

Exit status: 0 when everything passes, 1 when a check fails, 77 (skipped)
without a kubectl whose kustomize is v5 or later.
Environment: FERRUMCTL and FERRUM_WORKER name the programs whose flags the
manifests must use (default: build/bin/ferrumctl, build/bin/ferrum-worker);
without them the flag check is skipped, the rest runs.
"""
import copy
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import jsonschema
    import kubernetes_validate
    import yaml
except ImportError as e:
    sys.exit(f"k8s_validate: {e}: run deploy/setup.sh --test (deploy/requirements-test.txt)")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
K8S = ROOT / "deploy" / "k8s"
LWS_SCHEMA = HERE / "k8s_lws_schema.yaml"
YAMLLINT_CONFIG = K8S / "yamllint.yaml"

# 1.30: the oldest the manifests support (preStop's sleep action is on by
# default from 1.30); 1.37: the newest kubernetes-validate 1.37.0 bundles.
KUBE_VERSIONS = ("1.30", "1.37")
KUSTOMIZE_MIN = (5, 0)
HTTP_PORT = 8000
MIN_DRAIN_S = 120    # grace period left for serve's drain after preStop
MIN_STARTUP_S = 600  # the startup probe's budget for loading a model
MIN_LIVENESS_S = 300  # 503s before a restart: serve reloads a worker itself
LWS_ENV = ("LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX")
SERVER_CONTAINER, WORKER_CONTAINER = "ferrum", "ferrum-worker"
API_KEY_SECRET = ("ferrum-api-key", "api-key")

# (name, the folder under deploy/k8s, with the api-key component)
VARIANTS = [
    ("single-node", "single-node", False),
    ("single-node+api-key", "single-node", True),
    ("data-parallel", "data-parallel", False),
    ("data-parallel+api-key", "data-parallel", True),
    ("multi-node", "multi-node", False),
    ("multi-node+api-key", "multi-node", True),
    ("deploy/k8s/README.md's example", None, True),
]


class RenderError(Exception):
    pass


# ---- rendering --------------------------------------------------------------

def kustomize_version():
    """kubectl's kustomize version as (major, minor), None without kubectl."""
    if not shutil.which("kubectl"):
        return None
    r = subprocess.run(["kubectl", "version", "--client", "-o", "yaml"], capture_output=True, text=True,
                       timeout=60)
    m = re.search(r"kustomizeVersion:\s*v(\d+)\.(\d+)", r.stdout)
    return (int(m.group(1)), int(m.group(2))) if m else None


def kustomize(folder):
    """The objects `kubectl kustomize FOLDER` renders."""
    r = subprocess.run(["kubectl", "kustomize", str(folder)], capture_output=True, text=True, timeout=120)
    if r.returncode:
        raise RenderError(r.stderr.strip() or f"kubectl kustomize exit {r.returncode}")
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def render(k8s, base, api_key, tmp):
    """A variant's objects: the folder itself, or a kustomization of ours
    that adds the api-key component to it (as deploy/k8s/README.md says)."""
    if not api_key:
        return kustomize(k8s / base)
    d = Path(tempfile.mkdtemp(dir=tmp))
    kust = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": [os.path.relpath(k8s / base, d)],
            "components": [os.path.relpath(k8s / "components" / "api-key", d)]}
    (d / "kustomization.yaml").write_text(yaml.safe_dump(kust))
    return kustomize(d)


# ---- schemas ----------------------------------------------------------------

def objname(o):
    return f"{o.get('kind')}/{(o.get('metadata') or {}).get('name')}"


def kube_errors(where, doc):
    errs = []
    for v in KUBE_VERSIONS:
        try:
            kubernetes_validate.validate(doc, v, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path) or "(top)"
            errs.append(f"{where}: Kubernetes {v} schema: {path}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            errs.append(f"{where}: {e.message}")
    return errs


def lws_errors(o, lws_validator):
    where = objname(o)
    errs = [f"{where}: LWS schema: {'.'.join(str(p) for p in e.path) or '(top)'}: {e.message}"
            for e in lws_validator.iter_errors(o)]
    lwt = ((o.get("spec") or {}).get("leaderWorkerTemplate")) or {}
    for t in ("leaderTemplate", "workerTemplate"):
        if isinstance(lwt.get(t), dict):
            wrapped = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": o.get("metadata"),
                       "template": lwt[t]}
            errs += kube_errors(f"{where} {t} (as a PodTemplate)", wrapped)
    return errs


def check_schemas(objs, lws_validator):
    errs = []
    for o in objs:
        if o.get("kind") == "LeaderWorkerSet":
            errs += lws_errors(o, lws_validator)
        else:
            errs += kube_errors(objname(o), o)
    return errs


# ---- ferrum's rules ---------------------------------------------------------

def pod_templates(objs):
    """(where, pod template, role, the LeaderWorkerSet or None) per pod
    template; role "server" runs serve, "worker" one ferrum-worker."""
    for o in objs:
        if o["kind"] == "Deployment":
            yield objname(o), o["spec"]["template"], "server", None
        elif o["kind"] == "LeaderWorkerSet":
            lwt = o["spec"]["leaderWorkerTemplate"]
            yield f"{objname(o)} leader", lwt["leaderTemplate"], "server", o
            yield f"{objname(o)} worker", lwt["workerTemplate"], "worker", o


def find(objs, kind, name):
    return next((o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name), None)


def container_env(c, objs, lws, role, errs, where):
    """The container's environment as far as the manifests fix it: name ->
    value, None where it is set but not known here (a Secret, LWS_*)."""
    env = {}
    for ef in c.get("envFrom", []):
        ref = ef.get("configMapRef")
        cm = find(objs, "ConfigMap", ref["name"]) if ref else None
        if ref and cm is None:
            errs.append(f"{where}: envFrom names ConfigMap {ref['name']}, which is not rendered")
        elif cm:
            env.update(cm.get("data") or {})
    if lws:
        env.update({k: None for k in LWS_ENV})
        env["LWS_GROUP_SIZE"] = str(lws["spec"]["leaderWorkerTemplate"].get("size", 1))
        if role == "server":
            env["LWS_WORKER_INDEX"] = "0"
    for e in c.get("env", []):
        env[e["name"]] = e.get("value")
    return env


def parse_flags(args, env, errs, where):
    """--name=value args -> {name: (raw value, value with $(VAR)s replaced,
    None when a VAR's value is not known here)}."""
    flags = {}
    for a in args:
        m = re.fullmatch(r"--([a-z0-9][a-z0-9-]*)(?:=(.*))?", a, re.S)
        if not m:
            errs.append(f"{where}: argument {a!r} is not --flag or --flag=value")
            continue
        raw = m.group(2)
        val = raw
        for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", raw or ""):
            if var not in env:
                errs.append(f"{where}: --{m.group(1)} uses $({var}), which the container does not define")
                val = None
            elif val is not None:
                val = None if env[var] is None else val.replace(f"$({var})", env[var])
        flags[m.group(1)] = (raw, val)
    return flags


def as_int(v):
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def gpus(c):
    res = c.get("resources") or {}
    lim = as_int((res.get("limits") or {}).get("nvidia.com/gpu"))
    req = (res.get("requests") or {}).get("nvidia.com/gpu")
    return lim if req is None or as_int(req) == lim else None


def port_number(c, port):
    if isinstance(port, int):
        return port
    return next((p["containerPort"] for p in c.get("ports", []) if p.get("name") == port), None)


def prestop_sleep(c):
    return ((((c.get("lifecycle") or {}).get("preStop")) or {}).get("sleep") or {}).get("seconds", 0)


def check_pod_common(where, tmpl, errs):
    """Rules for every ferrum pod: non-root, /dev/shm in memory, the model
    read-only at /models, a GPU per container."""
    spec = tmpl["spec"]
    if not (spec.get("securityContext") or {}).get("runAsNonRoot"):
        errs.append(f"{where}: securityContext.runAsNonRoot is not true")
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    for c in spec["containers"]:
        mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
        shm = vols.get(mounts["/dev/shm"]["name"]) if "/dev/shm" in mounts else None
        ed = (shm or {}).get("emptyDir")
        if ed is None or ed.get("medium") != "Memory" or not ed.get("sizeLimit"):
            errs.append(f"{where}: {c['name']}: /dev/shm is not an emptyDir with medium Memory and a sizeLimit")
        if not (mounts.get("/models") or {}).get("readOnly"):
            errs.append(f"{where}: {c['name']}: the model is not mounted read-only at /models")
        if not gpus(c):
            errs.append(f"{where}: {c['name']}: no nvidia.com/gpu limit (requests, where set, must equal it)")
        if not re.fullmatch(r"([^ ]+/)?ferrum(:[\w.-]+)?(@sha256:[0-9a-f]{64})?", c.get("image") or ""):
            errs.append(f"{where}: {c['name']}: image {c.get('image')!r} is not ferrum's")


def check_probes(where, tmpl, c, errs):
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        p = c.get(kind)
        get = (p or {}).get("httpGet") or {}
        if get.get("path") != "/health" or port_number(c, get.get("port")) != HTTP_PORT:
            errs.append(f"{where}: {kind} is not GET /health on port {HTTP_PORT}")
    budget = lambda p: (p or {}).get("periodSeconds", 10) * (p or {}).get("failureThreshold", 3)
    if budget(c.get("startupProbe")) < MIN_STARTUP_S:
        errs.append(f"{where}: startupProbe allows less than {MIN_STARTUP_S} s to load the model")
    if budget(c.get("livenessProbe")) < MIN_LIVENESS_S:
        errs.append(f"{where}: livenessProbe restarts the pod after less than {MIN_LIVENESS_S} s of 503s, "
                    "while serve may be reloading a worker")
    ann = tmpl.get("metadata", {}).get("annotations") or {}
    want = {"prometheus.io/scrape": "true", "prometheus.io/port": str(HTTP_PORT), "prometheus.io/path": "/metrics"}
    for k, v in want.items():
        if ann.get(k) != v:
            errs.append(f"{where}: annotation {k} is {ann.get(k)!r}, not {v!r}")


def check_serve_keys(where, env, flags, errs):
    """Each SERVE_X_Y of the ConfigMap is passed as --x-y=$(SERVE_X_Y)."""
    for name, (raw, _) in flags.items():
        for var in re.findall(r"\$\((SERVE_[A-Z0-9_]+)\)", raw or ""):
            if var != "SERVE_" + name.upper().replace("-", "_"):
                errs.append(f"{where}: --{name} takes $({var}): SERVE_X_Y belongs to --x-y")
    used = {v for raw, _ in flags.values() for v in re.findall(r"\$\(([A-Z0-9_]+)\)", raw or "")}
    for k in env:
        if k.startswith("SERVE_") and k not in used:
            errs.append(f"{where}: {k} is in the environment but no flag uses it")


def check_server(where, tmpl, lws, objs, api_key, errs):
    spec = tmpl["spec"]
    c = next((c for c in spec["containers"] if c["name"] == SERVER_CONTAINER), None)
    if c is None:
        errs.append(f"{where}: no container named {SERVER_CONTAINER}")
        return {}
    if c.get("command"):
        errs.append(f"{where}: the image's entrypoint is ferrumctl serve: give args, not command")
    env = container_env(c, objs, lws, "server", errs, where)
    flags = parse_flags(c.get("args", []), env, errs, where)
    check_probes(where, tmpl, c, errs)
    check_serve_keys(where, env, flags, errs)
    if flags.get("host", (0, 0))[1] != "0.0.0.0" or as_int(flags.get("port", (0, 0))[1]) != HTTP_PORT:
        errs.append(f"{where}: serve does not listen on 0.0.0.0:{HTTP_PORT} (--host, --port)")
    if port_number(c, "http") != HTTP_PORT:
        errs.append(f"{where}: no container port named http = {HTTP_PORT}")
    grace = spec.get("terminationGracePeriodSeconds", 30)
    if grace - prestop_sleep(c) < MIN_DRAIN_S:
        errs.append(f"{where}: terminationGracePeriodSeconds {grace} leaves serve less than {MIN_DRAIN_S} s "
                    f"to drain after preStop's {prestop_sleep(c)} s")
    tp = as_int(flags.get("tensor-parallel-size", (0, "1"))[1])
    g = gpus(c)
    if lws is None and tp != g:
        errs.append(f"{where}: --tensor-parallel-size is {tp} but the container has {g} GPU(s)")
    if lws is not None:
        size = lws["spec"]["leaderWorkerTemplate"].get("size", 1)
        remote = as_int(flags.get("remote-workers", (0, "0"))[1])
        # Worker pod i is rank LWS_WORKER_INDEX = i: the leader holds rank 0
        # alone, every other rank is remote.
        if tp != size or g != 1 or remote != size - 1:
            errs.append(f"{where}: tensor-parallel size {tp}, {g} leader GPU(s) and --remote-workers {remote} "
                        f"do not add up for a group of {size} one-GPU pods")
        if lws["spec"]["leaderWorkerTemplate"].get("restartPolicy") != "None":
            errs.append(f"{where}: restartPolicy must be None: serve restarts the group itself when a remote rank "
                        "comes back, and a recreated group would lose the leader's requests")
        check_nccl(where, c, errs)
    check_api_key(where, c, flags, api_key, errs)
    return flags


def check_api_key(where, c, flags, api_key, errs):
    has = "api-key" in flags
    if not api_key:
        if has:
            errs.append(f"{where}: --api-key without the api-key component")
        return
    ev = next((e for e in c.get("env", []) if e["name"] == "SERVE_API_KEY"), None)
    ref = (((ev or {}).get("valueFrom")) or {}).get("secretKeyRef") or {}
    if flags.get("api-key", (None,))[0] != "$(SERVE_API_KEY)" or (ref.get("name"), ref.get("key")) != API_KEY_SECRET \
            or ref.get("optional"):
        errs.append(f"{where}: the api-key variant does not pass --api-key=$(SERVE_API_KEY) from the Secret "
                    f"{API_KEY_SECRET[0]} (key {API_KEY_SECRET[1]}, not optional)")


def check_nccl(where, c, errs):
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    if not env.get("NCCL_SOCKET_IFNAME") or env.get("NCCL_NVLS_ENABLE") != "0":
        errs.append(f"{where}: NCCL_SOCKET_IFNAME unset or NCCL_NVLS_ENABLE not 0")


def check_secret_files(where, spec, c, flags, errs):
    """Every file a flag names under a Secret volume's mount is one of the
    items that volume projects."""
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    for m in c.get("volumeMounts", []):
        sec = (vols.get(m["name"]) or {}).get("secret")
        if not sec:
            continue
        items = {i["path"] for i in sec.get("items", [])}
        for name, (raw, _) in flags.items():
            if raw and raw.startswith(m["mountPath"] + "/") and (items and raw[len(m["mountPath"]) + 1:] not in items):
                errs.append(f"{where}: --{name}={raw} is not among the items of Secret {sec.get('secretName')}")


def check_worker(where, tmpl, lws, objs, leader_flags, leader_tmpl, errs):
    spec = tmpl["spec"]
    c = next((c for c in spec["containers"] if c["name"] == WORKER_CONTAINER), None)
    if c is None:
        errs.append(f"{where}: no container named {WORKER_CONTAINER}")
        return {}
    if c.get("command") != ["ferrum-worker"]:
        errs.append(f"{where}: command is {c.get('command')}, not [ferrum-worker]")
    env = container_env(c, objs, lws, "worker", errs, where)
    flags = parse_flags(c.get("args", []), env, errs, where)
    ep = (leader_flags.get("worker-endpoint") or (None,))[0] or ""
    port = ep.rsplit(":", 1)[-1]
    leader_c = next((x for x in leader_tmpl["spec"]["containers"] if x["name"] == SERVER_CONTAINER), {})
    want = {"connect": f"tcp://$(LWS_LEADER_ADDRESS):{port}", "rank": "$(LWS_WORKER_INDEX)",
            "world-size": "$(LWS_GROUP_SIZE)", "device": "cuda:0"}
    for k, v in want.items():
        if (flags.get(k) or (None,))[0] != v:
            errs.append(f"{where}: --{k} is {(flags.get(k) or (None,))[0]!r}, not {v!r}")
    if not ep.startswith("tcp://") or port_number(leader_c, "workers") != as_int(port):
        errs.append(f"{where}: the leader's --worker-endpoint {ep!r} is not tcp:// on its container port 'workers'")
    if gpus(c) != 1:
        errs.append(f"{where}: a worker pod holds one rank: nvidia.com/gpu must be 1, not {gpus(c)}")
    leader_grace = leader_tmpl["spec"].get("terminationGracePeriodSeconds", 30)
    if prestop_sleep(c) < leader_grace or spec.get("terminationGracePeriodSeconds", 30) <= prestop_sleep(c):
        errs.append(f"{where}: a worker must outlive its leader's drain: preStop sleep {prestop_sleep(c)} s >= the "
                    f"leader's grace {leader_grace} s, and its own grace period longer than that")
    check_nccl(where, c, errs)
    check_secret_files(where, spec, c, flags, errs)
    return flags


def check_services(objs, errs):
    servers = [t for _, t, role, _ in pod_templates(objs) if role == "server"]
    workers = [t for _, t, role, _ in pod_templates(objs) if role == "worker"]
    lws_names = {o["metadata"]["name"] for o in objs if o["kind"] == "LeaderWorkerSet"}
    svcs = [o for o in objs if o["kind"] == "Service"]
    if not svcs:
        errs.append("no Service")
    for s in svcs:
        where = objname(s)
        sel = s["spec"].get("selector") or {}
        match = lambda t: sel and all(t["metadata"].get("labels", {}).get(k) == v for k, v in sel.items())
        if not all(match(t) for t in servers) or any(match(t) for t in workers):
            errs.append(f"{where}: selector {sel} does not pick the serving pods (and only them)")
        ports = s["spec"].get("ports", [])
        if not any(p.get("name") == "http" and p.get("port") == HTTP_PORT and p.get("targetPort") in ("http", HTTP_PORT)
                   for p in ports):
            errs.append(f"{where}: no port http {HTTP_PORT} -> the pods' http")
        if s["metadata"]["name"] in lws_names:
            errs.append(f"{where}: LWS makes a headless Service named after the LeaderWorkerSet: pick another name")


def check_ferrum(objs, api_key):
    """ferrum's rules over one rendered variant: (errors, flags used by serve
    and by ferrum-worker, for the --help check)."""
    errs, used = [], {"serve": {}, "worker": {}}
    if not any(o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("ferrum-serve") for o in objs):
        errs.append("no ferrum-serve ConfigMap")
    leader = {}
    for where, tmpl, role, lws in pod_templates(objs):
        check_pod_common(where, tmpl, errs)
        if role == "server":
            flags = check_server(where, tmpl, lws, objs, api_key, errs)
            used["serve"].update({k: where for k in flags})
            leader[id(lws)] = (flags, tmpl)
    for where, tmpl, role, lws in pod_templates(objs):
        if role == "worker":
            flags = check_worker(where, tmpl, lws, objs, *leader.get(id(lws), ({}, {"spec": {"containers": []}})), errs)
            used["worker"].update({k: where for k in flags})
    check_services(objs, errs)
    return errs, used


# ---- flags the programs know ------------------------------------------------

def program_flags():
    """{"serve": flags, "worker": flags} from the programs' --help, or {}
    where a program is not found."""
    build = ROOT / "build" / "bin"
    progs = {"serve": ([os.environ.get("FERRUMCTL") or str(build / "ferrumctl"), "serve", "--help"]),
             "worker": ([os.environ.get("FERRUM_WORKER") or str(build / "ferrum-worker"), "--help"])}
    known = {}
    for what, cmd in progs.items():
        if not os.access(cmd[0], os.X_OK):
            continue
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        known[what] = set(re.findall(r"--([a-z0-9][a-z0-9-]*)", r.stdout + r.stderr)) - {"help"}
    return known


def check_flags(used, known):
    return [f"{where}: --{f} is not a {what} flag ({what} --help)"
            for what, flags in used.items() if what in known
            for f, where in sorted(flags.items()) if f not in known[what]]


# ---- yamllint ---------------------------------------------------------------

def yamllint(paths):
    r = subprocess.run([sys.executable, "-m", "yamllint", "--strict", "-f", "parsable", "-c", str(YAMLLINT_CONFIG),
                        *map(str, paths)], capture_output=True, text=True, timeout=120)
    return [l for l in (r.stdout + r.stderr).splitlines() if l.strip()] or ([f"yamllint exit {r.returncode}"]
                                                                          if r.returncode else [])


# ---- the run ----------------------------------------------------------------

class Run:
    def __init__(self):
        self.passed = self.failed = 0

    def report(self, name, errs):
        if errs:
            self.failed += 1
            print(f"FAIL {name}")
            for e in errs:
                print(f"     {e}")
        else:
            self.passed += 1
            print(f"ok   {name}")

    def expect_rejected(self, name, errs, needle):
        """A negative case: the checks must fail, with needle in a message."""
        hit = [e for e in errs if needle in e]
        if hit:
            self.passed += 1
            print(f"ok   rejected: {name}: {hit[0][:160]}")
        else:
            self.failed += 1
            print(f"FAIL not rejected: {name} (wanted a message with {needle!r}; got {errs[:3]})")


README_EXAMPLE = "# my-ferrum/kustomization.yaml, beside deploy/"


def render_readme_example(tmp):
    """The kustomization deploy/k8s/README.md shows, next to deploy/k8s."""
    m = re.search(r"```yaml\n(" + re.escape(README_EXAMPLE) + r".*?)```", (K8S / "README.md").read_text(), re.S)
    if not m:
        raise RenderError(f"deploy/k8s/README.md has no yaml block starting {README_EXAMPLE!r}")
    d = Path(tempfile.mkdtemp(dir=tmp))
    (d / "deploy").mkdir()
    (d / "deploy" / "k8s").symlink_to(K8S)
    (d / "my-ferrum").mkdir()
    (d / "my-ferrum" / "kustomization.yaml").write_text(m.group(1))
    return kustomize(d / "my-ferrum")


def validate_variant(k8s, base, api_key, tmp, lws_validator, known):
    """All the checks on one variant (base None: the README's example);
    returns (errors, objects)."""
    try:
        objs = render_readme_example(tmp) if base is None else render(k8s, base, api_key, tmp)
    except RenderError as e:
        return [f"kubectl kustomize: {e}"], []
    errs = check_schemas(objs, lws_validator)
    if errs:  # ferrum's rules assume the shapes the schemas check
        return errs, objs
    ferrum_errs, used = check_ferrum(objs, api_key)
    return errs + ferrum_errs + check_flags(used, known), objs


def mutate_copy(tmp, path, old, new):
    """A copy of deploy/k8s with one text replacement in one file."""
    d = Path(tempfile.mkdtemp(dir=tmp)) / "k8s"
    shutil.copytree(K8S, d)
    p = d / path
    text = p.read_text()
    if old not in text:
        raise SystemExit(f"k8s_validate: negative case out of date: {old!r} not in {path}")
    p.write_text(text.replace(old, new, 1))
    return d


def negative_cases(run, objs_by_variant, tmp, lws_validator, known):
    # Copies of the manifests with a bad field: the schemas reject them.
    d = mutate_copy(tmp, "single-node/deployment.yaml", "imagePullPolicy: IfNotPresent",
                    "imagePullPolicy: IfNotPresent\n          gpus: 2")
    run.expect_rejected("an unknown field in the Deployment's container",
                        validate_variant(d, "single-node", False, tmp, lws_validator, known)[0], "'gpus'")
    d = mutate_copy(tmp, "multi-node/leaderworkerset.yaml", "    size: 4", "    sizes: 4")
    run.expect_rejected("an unknown field in the LeaderWorkerSet",
                        validate_variant(d, "multi-node", False, tmp, lws_validator, known)[0], "'sizes'")
    d = mutate_copy(tmp, "multi-node/leaderworkerset.yaml", "    restartPolicy: None", "    restartPolicy: Always")
    run.expect_rejected("a LeaderWorkerSet restartPolicy LWS does not have",
                        validate_variant(d, "multi-node", False, tmp, lws_validator, known)[0], "'Always'")
    d = mutate_copy(tmp, "multi-node/leaderworkerset.yaml", "            command:\n              - ferrum-worker",
                    "            command: ferrum-worker")
    run.expect_rejected("a worker pod template whose command is not a list",
                        validate_variant(d, "multi-node", False, tmp, lws_validator, known)[0],
                        "workerTemplate (as a PodTemplate)")
    d = mutate_copy(tmp, "single-node/serve.env", "SERVE_MAX_NUM_SEQS=256", "SERVE_MAX_NUM_SEQS=256\nSERVE_SEED=1")
    run.expect_rejected("a ConfigMap key no flag uses",
                        validate_variant(d, "single-node", False, tmp, lws_validator, known)[0],
                        "SERVE_SEED is in the environment")
    # ferrum's rules on edited copies of rendered objects.
    single, multi = objs_by_variant["single-node"], objs_by_variant["multi-node"]

    def edited(objs, kind, fn, api_key=False):
        objs = copy.deepcopy(objs)
        o = next(o for o in objs if o["kind"] == kind)
        fn(o)
        return check_ferrum(objs, api_key)[0]

    dep_c = lambda o: o["spec"]["template"]["spec"]["containers"][0]
    lws_lt = lambda o: o["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
    lws_wt = lambda o: o["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    run.expect_rejected("a liveness probe on port 8080", edited(
        single, "Deployment", lambda o: dep_c(o)["livenessProbe"]["httpGet"].update(port=8080)), "livenessProbe")
    run.expect_rejected("a liveness probe that gives up after 30 s", edited(
        single, "Deployment", lambda o: dep_c(o)["livenessProbe"].update(failureThreshold=3)), "livenessProbe restarts")
    run.expect_rejected("/dev/shm on disk", edited(
        single, "Deployment", lambda o: o["spec"]["template"]["spec"]["volumes"][0]["emptyDir"].pop("medium")),
        "/dev/shm")
    run.expect_rejected("GPUs that do not match --tensor-parallel-size", edited(
        single, "Deployment", lambda o: [dep_c(o)["resources"][k].update({"nvidia.com/gpu": "3"})
                                         for k in ("requests", "limits")]), "has 3 GPU(s)")
    run.expect_rejected("a GPU request unlike the limit", edited(
        single, "Deployment", lambda o: dep_c(o)["resources"]["requests"].update({"nvidia.com/gpu": "1"})),
        "nvidia.com/gpu")
    run.expect_rejected("an optional API-key Secret (without it the key would be the text $(SERVE_API_KEY))", edited(
        objs_by_variant["single-node+api-key"], "Deployment",
        lambda o: dep_c(o)["env"][0]["valueFrom"]["secretKeyRef"].update(optional=True), api_key=True), "api-key")
    run.expect_rejected("a 30 s grace period", edited(
        single, "Deployment", lambda o: o["spec"]["template"]["spec"].update(terminationGracePeriodSeconds=30)),
        "to drain")
    run.expect_rejected("a flag that takes another key's $(VAR)", edited(
        single, "Deployment", lambda o: dep_c(o)["args"].__setitem__(
            dep_c(o)["args"].index("--max-num-seqs=$(SERVE_MAX_NUM_SEQS)"), "--max-num-seqs=$(SERVE_MAX_MODEL_LEN)")),
        "SERVE_X_Y belongs to --x-y")
    run.expect_rejected("an LWS size that does not match --remote-workers", edited(
        multi, "LeaderWorkerSet", lambda o: o["spec"]["leaderWorkerTemplate"].update(size=3)), "do not add up")
    run.expect_rejected("a worker that joins another port", edited(
        multi, "LeaderWorkerSet", lambda o: lws_wt(o)["containers"][0]["args"].__setitem__(
            0, "--connect=tcp://$(LWS_LEADER_ADDRESS):5557")), "--connect")
    run.expect_rejected("a worker that dies before its leader drains", edited(
        multi, "LeaderWorkerSet", lambda o: lws_wt(o)["containers"][0]["lifecycle"]["preStop"]["sleep"].update(
            seconds=10)), "outlive")
    run.expect_rejected("a worker key file the Secret does not project", edited(
        multi, "LeaderWorkerSet", lambda o: lws_wt(o)["volumes"][-1]["secret"]["items"].pop(0)), "worker.key")
    run.expect_rejected("a LeaderWorkerSet that recreates the group on a pod restart", edited(
        multi, "LeaderWorkerSet", lambda o: o["spec"]["leaderWorkerTemplate"].update(
            restartPolicy="RecreateGroupOnPodRestart")), "restartPolicy must be None")
    run.expect_rejected("a Service named like the LeaderWorkerSet", edited(
        multi, "Service", lambda o: o["metadata"].update(name="ferrum-lws")), "headless Service")
    run.expect_rejected("a leader without NCCL_NVLS_ENABLE=0", edited(
        multi, "LeaderWorkerSet", lambda o: lws_lt(o)["containers"][0]["env"].pop(1)), "NCCL")
    if "serve" in known:
        bad = copy.deepcopy(single)
        dep_c(next(o for o in bad if o["kind"] == "Deployment"))["args"].append("--max-model-length=4096")
        errs, used = check_ferrum(bad, False)
        run.expect_rejected("a flag serve does not know", check_flags(used, known), "--max-model-length")
    if "worker" in known:
        bad = copy.deepcopy(multi)
        lws_wt(next(o for o in bad if o["kind"] == "LeaderWorkerSet"))["containers"][0]["args"].append("--ranks=2")
        errs, used = check_ferrum(bad, False)
        run.expect_rejected("a flag ferrum-worker does not know", check_flags(used, known), "--ranks")
    # yamllint on a copy with a bad line.
    d = mutate_copy(tmp, "single-node/service.yaml", "  type: ClusterIP", "  type: ClusterIP   ")
    run.expect_rejected("trailing spaces (yamllint)", yamllint([d / "single-node" / "service.yaml"]),
                        "trailing-spaces")


def main():
    kv = kustomize_version()
    if kv is None or kv < KUSTOMIZE_MIN:
        print(f"k8s_validate: SKIP: needs kubectl with kustomize v{KUSTOMIZE_MIN[0]}+ "
              f"(kubectl 1.27 or later); found {'none' if kv is None else 'v%d.%d' % kv}")
        return 77
    lws_validator = jsonschema.Draft202012Validator(yaml.safe_load(LWS_SCHEMA.read_text()))
    known = program_flags()
    print(f"k8s_validate: kubectl kustomize v{kv[0]}.{kv[1]}, kubernetes-validate "
          f"{kubernetes_validate.__version__} (Kubernetes {', '.join(KUBE_VERSIONS)}, strict), "
          f"flags from --help: {', '.join(sorted(known)) or 'none (no build found)'}")
    run, objs_by_variant = Run(), {}
    run.report("yamllint deploy/k8s " + LWS_SCHEMA.name, yamllint([K8S, LWS_SCHEMA]))
    with tempfile.TemporaryDirectory(prefix="k8s_validate.") as tmp:
        for name, base, api_key in VARIANTS:
            errs, objs = validate_variant(K8S, base, api_key, Path(tmp), lws_validator, known)
            objs_by_variant[name] = objs
            kinds = ", ".join(sorted(o["kind"] for o in objs))
            run.report(f"{name}: {kinds}", errs)
        if run.failed == 0:
            negative_cases(run, objs_by_variant, Path(tmp), lws_validator, known)
    print(f"k8s_validate: {run.passed} passed, {run.failed} failed")
    return 1 if run.failed else 0


if __name__ == "__main__":
    sys.exit(main())
