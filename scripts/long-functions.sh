#!/usr/bin/env bash
# Lists the functions of node-agent/src/lifecycle/ (product code: no `*tests.rs` file, no
# `#[cfg(test)] mod`) longer than a limit (default 120 lines, signature to closing brace), with
# their length; exits 1 when there is one. Issue 40: "no function in lifecycle/ over ~120 lines".
# `just lint` runs it with the default limit.
# Usage: scripts/long-functions.sh [limit] [dir]
set -euo pipefail
limit="${1:-120}"
dir="${2:-$(dirname "$0")/../node-agent/src/lifecycle}"
exec python3 - "$limit" "$dir" <<'PY'
import os, re, sys

limit, root = int(sys.argv[1]), sys.argv[2]

def strip(src):
    """The source with comments, strings and char literals blanked (newlines kept)."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i)); i = j
        elif src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j): depth, j = depth + 1, j + 2
                elif src.startswith("*/", j): depth, j = depth - 1, j + 2
                else: j += 1
            out.append(re.sub(r"[^\n]", " ", src[i:j])); i = j
        elif re.match(r'b?r#*"', src[i:i + 40]) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            m = re.match(r'b?r(#*)"', src[i:])
            end = '"' + m.group(1)
            j = src.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append(re.sub(r"[^\n]", " ", src[i:j])); i = j
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            j += 1
            out.append(re.sub(r"[^\n]", " ", src[i:j])); i = j
        elif c == "'":
            m = re.match(r"'(\\.[^']*|[^\\'])'", src[i:])
            if m:
                out.append(" " * m.end()); i += m.end()
            else:  # a lifetime
                out.append(c); i += 1
        else:
            out.append(c); i += 1
    return "".join(out)

def block_end(code, open_at):
    depth = 0
    for j in range(open_at, len(code)):
        if code[j] == "{": depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0: return j
    return len(code) - 1

found = []
for dirpath, _, files in os.walk(root):
    for f in sorted(files):
        if not f.endswith(".rs") or f.endswith("tests.rs"):
            continue
        path = os.path.join(dirpath, f)
        code = strip(open(path).read())
        line = lambda at: code.count("\n", 0, at) + 1
        skip = []
        for m in re.finditer(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{", code):
            skip.append((m.start(), block_end(code, m.end() - 1)))
        for m in re.finditer(r"\bfn\s+(\w+)", code):
            if any(a <= m.start() <= b for a, b in skip):
                continue
            body = re.compile(r"[{;]").search(code, m.end())
            if not body or body.group() == ";":
                continue
            length = line(block_end(code, body.start())) - line(m.start()) + 1
            if length > limit:
                found.append((length, os.path.relpath(path, root), line(m.start()), m.group(1)))
for length, path, at, name in sorted(found, reverse=True):
    print(f"{length:5} lines  lifecycle/{path}:{at}  {name}")
if found:
    print(f"{len(found)} function(s) over {limit} lines", file=sys.stderr)
    sys.exit(1)
print(f"no function over {limit} lines", file=sys.stderr)
PY
