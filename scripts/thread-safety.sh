#!/usr/bin/env bash
# Checks the lock annotations (ABSL_GUARDED_BY, ABSL_EXCLUSIVE_LOCKS_REQUIRED, ...) over the
# whole tree: every C++ file of a configured build (its compile_commands.json) is parsed by
# clang with -Wthread-safety as an error, syntax only (no code generated, so it costs a
# fraction of a build). gcc ignores the annotations; this is what makes them a check.
#   scripts/thread-safety.sh [BUILD_DIR]   (default build/; configured by scripts/build.sh)
# Exits 77 (skipped) when clang++ is not installed, 1 when any file fails.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
clang="${TANDEM_CLANGXX:-$(command -v clang++ || true)}"
if [ -z "$clang" ]; then
  echo "thread-safety: clang++ not found (apt-get install clang); skipped"
  exit 77
fi
[ -f "$build/compile_commands.json" ] || { echo "thread-safety: no $build/compile_commands.json"; exit 1; }
jobs="${TANDEM_BUILD_JOBS:-$(nproc)}"
# One shell line per project C++ file (generated code and CUDA sources left out): the
# compile command with clang++ in place of the compiler, no output file, and every warning
# off but the thread-safety analysis, which fails the file.
python3 - "$build/compile_commands.json" "$root" "$clang" >"$build/thread-safety.cmds" <<'PY'
import json, shlex, sys
db, root, clang = sys.argv[1], sys.argv[2], sys.argv[3]
seen = set()
for e in json.load(open(db)):
    f = e["file"]
    rel = f[len(root) + 1:] if f.startswith(root + "/") else None
    if rel is None or rel.split("/")[0].startswith(("build", ".")) \
            or not f.endswith((".cc", ".cpp")) or f in seen:
        continue
    seen.add(f)
    args = e.get("arguments") or shlex.split(e["command"])
    # Drop the launcher (ccache) and the compiler, the output and the dependency-file flags.
    while args and not args[0].startswith("-") and ("ccache" in args[0] or "++" in args[0]
                                                    or args[0].endswith(("cc", "gcc", "g++"))):
        args = args[1:]
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
            continue
        if a in ("-c", "-MD", "-MMD") or a.startswith("-fdiagnostics-color"):
            continue
        out.append(a)
    cmd = [clang] + out + ["-fsyntax-only", "-Wno-everything", "-Wthread-safety",
                           "-Wthread-safety-beta", "-Werror=thread-safety",
                           "-Werror=thread-safety-beta"]
    print("cd %s && %s" % (shlex.quote(e["directory"]), shlex.join(cmd)))
PY
n="$(wc -l <"$build/thread-safety.cmds")"
echo "thread-safety: clang -Wthread-safety over $n files ($jobs at a time)"
if ! tr '\n' '\0' <"$build/thread-safety.cmds" | xargs -0 -P "$jobs" -I{} bash -c '{}'; then
  echo "thread-safety: FAILED (see the errors above)"
  exit 1
fi
echo "thread-safety: $n files, 0 errors"
