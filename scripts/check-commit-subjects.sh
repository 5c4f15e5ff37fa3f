#!/usr/bin/env bash
# Commit subjects of at most 72 characters, the why in the body (issue 40): checked for every
# non-merge commit from the one that added this script on, so `git log --oneline` scans. Older
# history stays as it is (rewriting it would change every hash). Run by `just lint`.
set -euo pipefail
cd "$(dirname "$0")/.."
max=72
if ! git rev-parse --git-dir >/dev/null 2>&1; then
    echo "check-commit-subjects: not a git checkout; nothing to check"
    exit 0
fi
first=$(git log --diff-filter=A --format=%H -- scripts/check-commit-subjects.sh | tail -1)
if [[ -z "$first" ]]; then
    echo "check-commit-subjects: not committed yet; nothing to check"
    exit 0
fi
range="$first^..HEAD"
git rev-parse -q --verify "$first^" >/dev/null || range="$first..HEAD"
bad=$(git log --no-merges --format='%h %s' "$range" | awk -v max="$max" '{ s = substr($0, index($0, " ") + 1); if (length(s) > max) printf "  %s (%d characters)\n", $0, length(s) }')
if [[ -n "$bad" ]]; then
    echo "check-commit-subjects: subjects longer than $max characters (put the detail in the body):" >&2
    echo "$bad" >&2
    exit 1
fi
echo "check-commit-subjects: ok ($(git rev-list --no-merges --count "$range") commits, subjects <= $max)"
