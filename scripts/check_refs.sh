#!/usr/bin/env bash
# The code's references to docs/design.md name what is there, and its module table names what
# is in the tree.  Fails (status 1, one line per fault, FILE:LINE first) when
#   - a comment (or any line) of a *.c, *.h, *.def, *.S, *.sh or *.py file of the tree names a
#     section of design.md that does not exist.  A section is named by its heading's text in
#     quotes, after the file and a comma: docs/design.md, "Keys" (several: "A" and "B", or
#     "A", "B"; a heading's backticks may be left out), or by its anchor: design.md#keys.
#     A section number (the section sign and a digit) is a fault: design.md has no numbered
#     sections.  So is a section named without quotes (design.md, Keys), which cannot be told
#     from prose;
#   - the table under "## Modules" leaves out a file of base/, config/, cache/, loader/, gpu/,
#     shim/ or tools/ (its first column: `dir/file`, then `file`s of the same folder), or names
#     one that does not exist.
# Needs no build; run by scripts/test.sh before the builds.
#   check_refs.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

# Waivers: references reported, not failed, while they are there; a waiver that no longer
# matches fails, so that it is removed with the fix.
#   FILE|TEXT  (TEXT: the reference as it reads after "design.md"), one a line; none now.
waivers=''

if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	files=$(git ls-files -co --exclude-standard)
else
	files=$(find . -type f -not -path './.git/*' | sed 's|^\./||')
fi
# This script's own comments show the forms it refuses.
sources=$(grep -E '\.(c|h|def|S|sh|py)$' <<<"$files" | grep -vx 'scripts/check_refs.sh' | sort)
product=$(grep -E '^(base|config|cache|loader|gpu|shim|tools)/' <<<"$files" |
	grep -v '/CMakeLists\.txt$' | sort)

tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
# shellcheck disable=SC2086 # the file lists are one name a line, without spaces
awk -v waivers="$waivers" -v product="$(tr '\n' ' ' <<<"$product")" '
function trim(s) { gsub(/^[ \t]+|[ \t]+$/, "", s); return s }
function squash(s) { gsub(/[ \t]+/, " ", s); return trim(s) }
function slug(s) { s = tolower(s); gsub(/[^a-z0-9 _-]/, "", s); gsub(/ /, "-", s); return s }
# A line of code without its comment leader: "/* ", " * ", "// ", "# ".
function bare(s) { sub(/^[ \t]*(\/\*+|\*+\/?|\/\/+|#+)?[ \t]?/, "", s); return s }
function fault(where, msg) { print where ": " msg; bad = 1 }
function check(where, rest,   q, n, name, tail, word) {
	if (rest ~ /^[ ,]*§/) {
		fault(where, "a section number (design.md has none): name the heading, design.md, \"Heading\"")
		return
	}
	if (rest ~ /^#/) {
		match(rest, /^#[A-Za-z0-9_-]*/)
		name = substr(rest, 2, RLENGTH - 1)
		if (!(name in anchor))
			fault(where, "design.md#" name ": no such section")
		return
	}
	if (rest ~ /^, *"/) {
		tail = rest
		sub(/^, */, "", tail)
		while (match(tail, /^"[^"]*"/)) {
			name = squash(substr(tail, 2, RLENGTH - 2))
			if (!(name in heading))
				fault(where, "design.md, \"" name "\": no such section")
			tail = substr(tail, RLENGTH + 1)
			if (!match(tail, /^(,| and) *"/))
				break
			tail = substr(tail, RLENGTH)
		}
		return
	}
	if (rest ~ /^, *[A-Za-z]/) {
		q = rest
		sub(/^, */, "", q)
		n = split(q, word, " ")
		fault(where, "design.md, " word[1] "...: a section named without quotes (design.md, \"Heading\")")
	}
}
BEGIN {
	n = split(waivers, wl, "\n")
	for (i = 1; i <= n; i++)
		if (wl[i] != "")
			waived[wl[i]] = 0
	n = split(product, pl, " ")
	for (i = 1; i <= n; i++)
		if (pl[i] != "")
			inprod[pl[i]] = 1
}
# docs/design.md: its headings, and the module table.
FILENAME == "docs/design.md" {
	if ($0 ~ /^##+ /) {
		h = $0
		sub(/^#+ /, "", h)
		h = squash(h)
		heading[h] = 1
		plain = h
		gsub(/`/, "", plain)
		heading[plain] = 1
		anchor[slug(h)] = 1
		inmod = (h == "Modules")
		next
	}
	if (inmod && $0 ~ /^\| `/) {
		split($0, cell, "|")
		m = split(cell[2], ent, ",")
		dir = ""
		for (i = 1; i <= m; i++) {
			e = trim(ent[i])
			gsub(/`/, "", e)
			if (e ~ /\//) {
				dir = e
				sub(/[^\/]*$/, "", dir)
			} else {
				e = dir e
			}
			listed[e] = FNR
		}
	}
	next
}
# The sources: every line that mentions design.md, with the two after it (a reference may wrap).
FNR == 1 { flush(); file = FILENAME; nl = 0 }
{ line[++nl] = $0 }
function flush(   i, j, k, text, rest, p, w, found) {
	for (i = 1; i <= nl; i++) {
		# Each reference that starts on line i, read on into the two lines after it.
		k = gsub(/design\.md/, "&", line[i])
		if (!k)
			continue
		text = line[i]
		for (j = i + 1; j <= i + 2 && j <= nl; j++)
			text = text " " bare(line[j])
		text = squash(text)
		while (k-- > 0 && (p = index(text, "design.md")) > 0) {
			rest = substr(text, p + 9)
			found = 0
			for (w in waived) {
				split(w, wp, "|")
				if (wp[1] == file && index(rest, wp[2]) == 1) {
					waived[w]++
					found = 1
					print "check_refs: " file ":" i ": waived (" wp[2] "), for the shim split to fix" > "/dev/stderr"
				}
			}
			if (!found)
				check(file ":" i, rest)
			text = rest
		}
	}
	nl = 0
}
END {
	flush()
	for (f in inprod)
		if (!(f in listed))
			fault("docs/design.md", "the table under \"Modules\" does not list " f)
	for (f in listed)
		if (!(f in inprod) && system("test -e \"" f "\"") != 0)
			fault("docs/design.md:" listed[f], "the table under \"Modules\" names " f ", which does not exist")
	for (w in waived)
		if (!waived[w])
			fault("scripts/check_refs.sh", "the waiver " w " matches nothing now: remove it")
	exit bad
}
' docs/design.md $sources >"$tmp" && status=0 || status=$?
sort -t: -k1,1 -k2,2n "$tmp" | sed 's/^/check_refs: /'
[ "$status" = 0 ] && echo "check_refs: every reference to docs/design.md names a section; its module table, every file"
exit "$status"
